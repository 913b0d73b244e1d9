package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
)

// ceilingResult is the ceilings' line of --out.
type ceilingResult struct {
	Type          string  `json:"type"` // "ceiling"
	Rows          int     `json:"rows"`
	DB            float64 `json:"db_rows_per_s"`           // the statement, from the table's head each time (median of the rounds)
	DBKeyset      float64 `json:"db_keyset_rows_per_s"`    // the same, from where the last statement ended
	DrainDefault  float64 `json:"drain_default_msg_per_s"` // the median of the rounds
	DrainTick50ms float64 `json:"drain_tick50ms_msg_per_s"`
	// The medians of each round's ratios: the figures the goals are
	// read against (a round's drains against its own ceiling).
	DefaultOfCeiling float64 `json:"drain_default_of_ceiling"`
	Tick50msOfCeil   float64 `json:"drain_tick50ms_of_ceiling"`
	Tick50msOfDef    float64 `json:"drain_tick50ms_of_default"`
	// Each round's figures, in the order run.
	DBRuns            []float64 `json:"db_runs"`
	DBKeysetRuns      []float64 `json:"db_keyset_runs"`
	DrainDefaultRuns  []float64 `json:"drain_default_runs"`
	DrainTick50msRuns []float64 `json:"drain_tick50ms_runs"`
	// How long each drain's binary took from its start to its first message
	// (connecting, checking the schema, its first page): part of the drain's
	// time, as it is of a user's restart.
	FirstDefaultRuns  []float64 `json:"drain_default_first_s"`
	FirstTick50msRuns []float64 `json:"drain_tick50ms_first_s"`
}

// ceilings measures, in this cluster, --drain-runs rounds of: the minimal
// table's claim-and-mark rate (both ways), then the binary's drain at its
// default tick and at --tick 50ms (their order alternating from round to
// round). Each round's drains are compared with that round's ceiling and the
// ratios' medians reported: one measurement of each differed by up to 30 %
// from round to round on the 2-core machine (the ceiling 115k to 156k rows/s
// within a minute), enough to hide or fake the ratio the issue asks for when
// one ceiling was set against the drains' median.
func ceilings(ctx context.Context, cfg *config, cl *cluster) (ceilingResult, error) {
	c := ceilingResult{Type: "ceiling", Rows: cfg.drainRows}
	args := append(append(append([]string{}, baseArgs...), cfg.migrateArgs...), cfg.sweeperArgs...)
	drain := func(i int, tick50 bool) error {
		name, a, label := "drain_default", args, "its default tick"
		if tick50 {
			name, a, label = "drain_tick50ms", append(append([]string{}, args...), "--tick", "50ms"), "--tick 50ms"
		}
		fmt.Fprintf(os.Stderr, "soak: round %d of %d: the binary's drain of %d rows at %s\n", i+1, cfg.drainRuns, cfg.drainRows, label)
		r, first, err := drainRate(ctx, cfg, cl, name, cfg.drainRows, a)
		if err != nil {
			return err
		}
		if tick50 {
			c.DrainTick50msRuns, c.FirstTick50msRuns = append(c.DrainTick50msRuns, r), append(c.FirstTick50msRuns, first.Seconds())
		} else {
			c.DrainDefaultRuns, c.FirstDefaultRuns = append(c.DrainDefaultRuns, r), append(c.FirstDefaultRuns, first.Seconds())
		}
		return nil
	}
	var ofCeil, tickOfCeil, tickOfDef []float64
	for i := range cfg.drainRuns {
		url, err := cl.createDB(ctx, "ceiling")
		if err != nil {
			return c, err
		}
		fmt.Fprintf(os.Stderr, "soak: round %d of %d: the minimal table's ceiling, %d rows\n", i+1, cfg.drainRuns, cfg.drainRows)
		db, err := ceilingRate(ctx, url, cfg.drainRows, cfg.size, cfg.topics, false)
		if err != nil {
			return c, err
		}
		keyset, err := ceilingRate(ctx, url, cfg.drainRows, cfg.size, cfg.topics, true)
		if err != nil {
			return c, err
		}
		if err := cl.dropDB(ctx, "ceiling"); err != nil {
			return c, err
		}
		c.DBRuns, c.DBKeysetRuns = append(c.DBRuns, db), append(c.DBKeysetRuns, keyset)
		for _, tick50 := range []bool{i%2 == 1, i%2 == 0} {
			if err := drain(i, tick50); err != nil {
				return c, err
			}
		}
		def, t50 := c.DrainDefaultRuns[i], c.DrainTick50msRuns[i]
		ofCeil, tickOfCeil, tickOfDef = append(ofCeil, def/db), append(tickOfCeil, t50/db), append(tickOfDef, t50/def)
	}
	c.DB, c.DBKeyset = median(c.DBRuns), median(c.DBKeysetRuns)
	c.DrainDefault, c.DrainTick50ms = median(c.DrainDefaultRuns), median(c.DrainTick50msRuns)
	c.DefaultOfCeiling, c.Tick50msOfCeil, c.Tick50msOfDef = median(ofCeil), median(tickOfCeil), median(tickOfDef)
	return c, nil
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// list writes xs in format, separated by commas.
func list(format string, xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, ", ")
}

func rates(xs []float64) string { return list("%.0f", xs) }

func (c ceilingResult) print() {
	fmt.Fprintf(os.Stderr, "\nceilings (%d rows of the same size and topics, this cluster, %d rounds; medians, and each round's figure in order):\n", c.Rows, len(c.DBRuns))
	fmt.Fprintf(os.Stderr, "  minimal table, the issue's statement from the head   %8.0f rows/s  (%s)\n", c.DB, rates(c.DBRuns))
	fmt.Fprintf(os.Stderr, "  minimal table, keyset (id > last)                    %8.0f rows/s  (%s)\n", c.DBKeyset, rates(c.DBKeysetRuns))
	fmt.Fprintf(os.Stderr, "  binary drain, default tick   %8.0f msg/s  (%s); first message after %s s\n",
		c.DrainDefault, rates(c.DrainDefaultRuns), list("%.3f", c.FirstDefaultRuns))
	fmt.Fprintf(os.Stderr, "  binary drain, --tick 50ms    %8.0f msg/s  (%s); first message after %s s\n",
		c.DrainTick50ms, rates(c.DrainTick50msRuns), list("%.3f", c.FirstTick50msRuns))
	fmt.Fprintf(os.Stderr, "  median of the rounds' ratios: default tick %.2f of the ceiling (goal ≥ 0.8); --tick 50ms %.2f of the ceiling, %.2f of the default tick (goal ≥ 0.95)\n\n",
		c.DefaultOfCeiling, c.Tick50msOfCeil, c.Tick50msOfDef)
	// Benchmark lines on stdout, for benchstat.
	fmt.Printf("BenchmarkSoakCeiling/table=minimal 1 %.0f rows/s %.0f keyset-rows/s\n", c.DB, c.DBKeyset)
	fmt.Printf("BenchmarkSoakDrain/tick=default 1 %.0f msg/s %.3f of-ceiling\n", c.DrainDefault, c.DefaultOfCeiling)
	fmt.Printf("BenchmarkSoakDrain/tick=50ms 1 %.0f msg/s %.3f of-ceiling %.3f of-default-tick\n",
		c.DrainTick50ms, c.Tick50msOfCeil, c.Tick50msOfDef)
}

func printSummaries(cfg *config, sums []summary) {
	mb := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }
	opt := func(p *float64) string {
		if p == nil {
			return "never"
		}
		return fmt.Sprintf("%.1f s", *p)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-14s %7s %8s %8s %9s %9s %9s %9s %10s %12s %9s %6s\n", "phase", "rate", "offered", "rel/off",
		"lag max", "dlv p50", "dlv p99", "dlv max", "backlog", "size MB", "dead max", "avac")
	for _, s := range sums {
		fmt.Fprintf(&b, "%-14s %7d %8.0f %8.3f %8.2fs %8.3fs %8.3fs %8.2fs %10d %5s→%-6s %9d %6d\n", s.Phase, s.TargetRate,
			s.OfferedRate, s.Ratio, s.LagMax, s.DeliveryP50, s.DeliveryP99, s.DeliveryMax, s.BacklogMax,
			mb(s.SizeStart), mb(s.SizeEnd), s.DeadMax, s.Autovacuums)
	}
	for i, s := range sums {
		if i > 0 && sums[i-1].hold {
			fmt.Fprintf(&b, "after the hold: lag ≤ %s first after %s, and for good after %s\n", cfg.lagLimit, opt(s.RecoverS), opt(s.SettledS))
		}
		if s.Behind > 0 || s.WriterErrors > 0 {
			fmt.Fprintf(&b, "%s: the writer fell behind by %d transactions, %d failed\n", s.Phase, s.Behind, s.WriterErrors)
		}
		if s.Missing != nil {
			fmt.Fprintf(&b, "at the end, %s after the last row was offered at most (-tail): %d rows not arrived, %d duplicates\n", cfg.tail, *s.Missing, s.Duplicates)
		}
	}
	if cfg.mode == "step" {
		best := 0
		for _, s := range sums {
			if s.held(cfg.lagLimit) {
				best = max(best, s.TargetRate)
			}
		}
		fmt.Fprintf(&b, "highest rate held for %s with lag ≤ %s: %d rows/s\n", cfg.stepHold, cfg.lagLimit, best)
		if last := sums[len(sums)-1]; !last.held(cfg.lagLimit) {
			switch {
			case last.OfferedRate < 0.97*float64(last.TargetRate) && last.LagMax <= cfg.lagLimit.Seconds():
				fmt.Fprintf(&b, "stopped by the writer, not the relay: it offered %.0f of %d rows/s with the lag within the limit, so the figure is a lower bound (more --conns or --tx-rows)\n",
					last.OfferedRate, last.TargetRate)
			case last.WriterErrors > 0:
				fmt.Fprintf(&b, "stopped by the writer's errors\n")
			default:
				fmt.Fprintf(&b, "stopped by the lag: %.2fs at %d rows/s\n", last.LagMax, last.TargetRate)
			}
		}
		fmt.Printf("BenchmarkSoakStep 1 %d held-rows/s\n", best)
	}
	fmt.Fprint(os.Stderr, b.String())
	for _, s := range sums {
		line := fmt.Sprintf("BenchmarkSoak/phase=%s 1 %.4f relayed/offered %.0f lag-max-ms %.1f delivery-p99-ms %d backlog-max-rows %.2f size-start-MB %.2f size-end-MB %d dead-tuples-max",
			s.Phase, s.Ratio, s.LagMax*1000, s.DeliveryP99*1000, s.BacklogMax, float64(s.SizeStart)/(1<<20), float64(s.SizeEnd)/(1<<20), s.DeadMax)
		if s.RecoverS != nil {
			line += fmt.Sprintf(" %.1f recover-s", *s.RecoverS)
		}
		if s.SettledS != nil {
			line += fmt.Sprintf(" %.1f settled-s", *s.SettledS)
		}
		fmt.Println(line)
	}
}
