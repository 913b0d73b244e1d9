package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// phase is a stretch of the soak at one offered rate, with or without a
// session holding the horizon.
type phase struct {
	name string
	dur  time.Duration
	rate int  // rows a second
	hold bool // a REPEATABLE READ session holds a snapshot for the whole phase
}

// sample is one line of --out: the interval since the previous sample.
type sample struct {
	Type        string   `json:"type"` // "sample"
	Phase       string   `json:"phase"`
	T           float64  `json:"t"` // seconds since the soak began
	TargetRate  int      `json:"target_rate"`
	OfferedRate float64  `json:"offered_rate"` // rows committed a second in the interval
	RelayedRate float64  `json:"relayed_rate"` // lines on the sweeper's stdout a second in the interval
	Backlog     int64    `json:"backlog"`      // rows committed less rows arrived (end to end)
	Lag         float64  `json:"lag_s"`        // age of the oldest committed row not arrived (end to end)
	DeliveryP99 float64  `json:"delivery_p99_s"`
	DeliveryMax float64  `json:"delivery_max_s"`
	DBBacklog   *int64   `json:"db_backlog,omitempty"` // --backlog-sql's rows
	DBLag       *float64 `json:"db_lag_s,omitempty"`   // --backlog-sql's oldest age
	TableBytes  int64    `json:"table_bytes"`          // pg_table_size summed over --schema's tables
	IndexBytes  int64    `json:"index_bytes"`          // pg_indexes_size summed likewise
	DeadTuples  int64    `json:"dead_tuples"`          // n_dead_tup summed likewise
	LiveTuples  int64    `json:"live_tuples"`
	Autovacuums int64    `json:"autovacuums"` // autovacuum_count summed: since the database was made
	Duplicates  int64    `json:"duplicates"`
	WriterErrs  int64    `json:"writer_errors"`
	Behind      int64    `json:"writer_behind"` // transactions the writer could not start in time, in total
}

// summary is a phase's figures.
type summary struct {
	Type         string   `json:"type"` // "summary"
	Phase        string   `json:"phase"`
	Seconds      float64  `json:"seconds"`
	TargetRate   int      `json:"target_rate"`
	Offered      int64    `json:"offered"` // rows committed in the phase
	Relayed      int64    `json:"relayed"` // of the writer's rows, arrived in the phase (duplicates not counted)
	Ratio        float64  `json:"relayed_per_offered"`
	OfferedRate  float64  `json:"offered_rate"`
	LagMax       float64  `json:"lag_max_s"` // the oldest outstanding row's age, at its worst (checked every 100ms)
	DeliveryP50  float64  `json:"delivery_p50_s"`
	DeliveryP99  float64  `json:"delivery_p99_s"` // arrival less commit, over the rows arrived in the phase
	DeliveryMax  float64  `json:"delivery_max_s"`
	BacklogMax   int64    `json:"backlog_max"`
	SizeStart    int64    `json:"size_start_bytes"` // tables and indexes
	SizeEnd      int64    `json:"size_end_bytes"`
	DeadMax      int64    `json:"dead_tuples_max"`
	Autovacuums  int64    `json:"autovacuums"`         // in the phase
	RecoverS     *float64 `json:"recover_s,omitempty"` // after a hold: until the lag was first ≤ --lag-limit
	SettledS     *float64 `json:"settled_s,omitempty"` // after a hold: until the lag stayed ≤ --lag-limit to the phase's end
	Behind       int64    `json:"writer_behind"`
	WriterErrors int64    `json:"writer_errors"`
	Duplicates   int64    `json:"duplicates"`
	Missing      *int64   `json:"missing,omitempty"` // last phase: rows committed and not arrived when --tail ran out (or all had arrived)

	phaseState `json:"-"`
}

// held reports whether the phase kept the lag within limit at the rate asked.
func (s summary) held(limit time.Duration) bool {
	return s.LagMax <= limit.Seconds() && s.OfferedRate >= 0.97*float64(s.TargetRate) && s.WriterErrors == 0
}

// soak runs the phases plan gives, one after another, on one writer and one
// sweeper, and returns their summaries.
func soak(ctx context.Context, cfg *config, cl *cluster, enc *json.Encoder, plan func([]summary) (phase, bool)) ([]summary, error) {
	url, err := cl.createDB(ctx, "soak")
	if err != nil {
		return nil, err
	}
	if err := migrate(ctx, cfg, url); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = int32(cfg.conns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	mon, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer mon.Close(context.Background())

	w := &writer{pool: pool, insert: cfg.insert, topics: cfg.topicNames(), size: cfg.size, rowsPerTx: cfg.txRows, conns: cfg.conns}
	r := &reader{w: w}
	args := append(append(append([]string{}, baseArgs...), soakArgs...), cfg.migrateArgs...)
	sw, err := startSweeper(cfg.bin, url, append(args, cfg.sweeperArgs...), r.run)
	if err != nil {
		return nil, err
	}
	swStopped := false
	defer func() {
		if !swStopped {
			_ = sw.stop()
		}
	}()
	first, ok := plan(nil)
	if !ok {
		return nil, nil
	}
	w.rate.Store(int64(first.rate))
	wctx, stopWriter := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { w.run(wctx, ctx) })
	defer func() { stopWriter(); wg.Wait() }()

	m := &monitor{cfg: cfg, conn: mon, w: w, r: r, start: time.Now(), gone: sw.eof}
	prev := m.sample(ctx, "start", 0, nil) // the sizes before the first phase
	_ = enc.Encode(prev)

	var sums []summary
	for p, ok := first, true; ok; p, ok = plan(sums) {
		w.rate.Store(int64(p.rate))
		fmt.Fprintf(os.Stderr, "soak: phase %s, %s at %d rows/s\n", p.name, p.dur, p.rate)
		var hold pgx.Tx
		var holdConn *pgx.Conn
		if p.hold {
			if holdConn, err = pgx.Connect(ctx, url); err != nil {
				return sums, err
			}
			if hold, err = holdConn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead}); err == nil {
				// Reading anything takes the snapshot, which then holds
				// the horizon until the transaction ends.
				var n int64
				err = hold.QueryRow(ctx, "SELECT count(*) FROM pg_class").Scan(&n)
			}
			if err != nil {
				holdConn.Close(context.Background())
				return sums, fmt.Errorf("hold a snapshot: %w", err)
			}
		}
		var holdEnded time.Time
		if n := len(sums); n > 0 && sums[n-1].hold {
			holdEnded = sums[n-1].ended
		}
		s, err := m.phase(ctx, enc, p, prev, holdEnded)
		if hold != nil {
			_ = hold.Commit(context.Background())
			holdConn.Close(context.Background())
		}
		s.hold = p.hold
		s.ended = time.Now()
		prev = s.last
		sums = append(sums, s)
		if err != nil {
			return sums, err
		}
	}

	// The tail: no more rows offered; every committed row should arrive.
	stopWriter()
	wg.Wait()
	deadline := time.Now().Add(cfg.tail)
	committed := w.committed.Load()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, unique, _, _ := r.counts(); unique >= committed {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	swStopped = true
	if err := sw.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "soak: sweeper exit: %v\n", err)
	}
	_, unique, dups, _ := r.counts()
	missing := committed - unique
	last := &sums[len(sums)-1]
	last.Missing = &missing
	last.Duplicates = dups
	return sums, ctx.Err()
}

// summary's bookkeeping, not written out.
type phaseState struct {
	hold  bool
	ended time.Time
	last  sample
}

// monitor samples the soak.
type monitor struct {
	cfg   *config
	conn  *pgx.Conn
	w     *writer
	r     *reader
	start time.Time
	gone  <-chan struct{} // closed when the sweeper's output ends

	prevAt                 time.Time
	prevOffered, prevLines int64
	backlogErr, sizeErr    string
}

// phase runs p for its length: the lag is checked every 100ms, the rest sampled
// every --sample. After a hold (holdEnded set) it times the recovery.
func (m *monitor) phase(ctx context.Context, enc *json.Encoder, p phase, prev sample, holdEnded time.Time) (summary, error) {
	s := summary{Type: "summary", Phase: p.name, TargetRate: p.rate, SizeStart: prev.TableBytes + prev.IndexBytes}
	s.last = prev
	start := time.Now()
	offered0 := m.w.committed.Load()
	_, unique0, _, _ := m.r.counts()
	av0 := prev.Autovacuums
	behind0, errs0 := m.w.behind.Load(), m.w.errors.Load()
	var lags, interval []float32
	fine := time.NewTicker(100 * time.Millisecond)
	defer fine.Stop()
	nextSample := start.Add(m.cfg.sample)
	end := start.Add(p.dur)
	var settledAt time.Time // the first check of the run of checks, to now, with the lag within the limit
	var failed error
	for ctx.Err() == nil && failed == nil {
		var now time.Time
		select {
		case <-ctx.Done():
			s.Phase += "-interrupted" // no spaces: it names a benchmark line
			continue
		case <-m.gone:
			s.Phase += "-sweeper-exited"
			failed = fmt.Errorf("the sweeper exited during phase %s (its stderr is above)", p.name)
			continue
		case now = <-fine.C:
		}
		lag := m.r.oldest(now)
		s.LagMax = max(s.LagMax, lag.Seconds())
		if !holdEnded.IsZero() {
			switch {
			case lag > m.cfg.lagLimit:
				settledAt = time.Time{}
			case settledAt.IsZero():
				settledAt = now
			}
			if lag <= m.cfg.lagLimit && s.RecoverS == nil {
				v := now.Sub(holdEnded).Seconds()
				s.RecoverS = &v
			}
		}
		if !now.Before(nextSample) || !now.Before(end) {
			got := m.r.takeLags()
			lags = append(lags, got...)
			interval = append(interval[:0], got...)
			smp := m.sample(ctx, p.name, p.rate, interval)
			smp.Lag = max(smp.Lag, lag.Seconds())
			_ = enc.Encode(smp)
			s.BacklogMax = max(s.BacklogMax, smp.Backlog)
			s.DeadMax = max(s.DeadMax, smp.DeadTuples)
			s.last = smp
			nextSample = nextSample.Add(m.cfg.sample)
		}
		if !now.Before(end) {
			break
		}
	}
	if !holdEnded.IsZero() && !settledAt.IsZero() {
		v := settledAt.Sub(holdEnded).Seconds()
		s.SettledS = &v
	}
	s.Seconds = time.Since(start).Seconds()
	s.Offered = m.w.committed.Load() - offered0
	_, unique1, _, _ := m.r.counts()
	s.Relayed = unique1 - unique0
	if s.Offered > 0 {
		s.Ratio = float64(s.Relayed) / float64(s.Offered)
	}
	s.OfferedRate = float64(s.Offered) / s.Seconds
	s.DeliveryP50 = percentile(lags, 50)
	s.DeliveryP99 = percentile(lags, 99)
	s.DeliveryMax = percentile(lags, 100)
	s.SizeEnd = s.last.TableBytes + s.last.IndexBytes
	s.Autovacuums = s.last.Autovacuums - av0
	s.Behind = m.w.behind.Load() - behind0
	s.WriterErrors = m.w.errors.Load() - errs0
	if s.WriterErrors > 0 {
		m.w.mu.Lock()
		fmt.Fprintf(os.Stderr, "soak: %d of the writer's transactions failed in %s; the last: %v\n", s.WriterErrors, p.name, m.w.lastErr)
		m.w.mu.Unlock()
	}
	return s, cmp.Or(failed, ctx.Err())
}

// sample reads the counters and asks the database for sizes, dead tuples and
// (with --backlog-sql) its view of the backlog. lags are the delivery lags of
// the rows arrived in the interval.
func (m *monitor) sample(ctx context.Context, phaseName string, rate int, lags []float32) sample {
	now := time.Now()
	offered := m.w.committed.Load()
	lines, unique, dups, _ := m.r.counts()
	s := sample{Type: "sample", Phase: phaseName, T: now.Sub(m.start).Seconds(), TargetRate: rate,
		Backlog: offered - unique, Lag: m.r.oldest(now).Seconds(), Duplicates: dups,
		WriterErrs: m.w.errors.Load(), Behind: m.w.behind.Load()}
	if !m.prevAt.IsZero() {
		d := now.Sub(m.prevAt).Seconds()
		s.OfferedRate = float64(offered-m.prevOffered) / d
		s.RelayedRate = float64(lines-m.prevLines) / d
	}
	m.prevAt, m.prevOffered, m.prevLines = now, offered, lines
	s.DeliveryP99 = percentile(lags, 99)
	s.DeliveryMax = percentile(lags, 100)

	qctx, cancel := context.WithTimeout(ctx, max(m.cfg.sample, time.Second))
	defer cancel()
	if err := m.conn.QueryRow(qctx, `
		SELECT coalesce(sum(pg_table_size(c.oid)), 0)::bigint, coalesce(sum(pg_indexes_size(c.oid)), 0)::bigint,
		       coalesce(sum(s.n_dead_tup), 0)::bigint, coalesce(sum(s.n_live_tup), 0)::bigint,
		       coalesce(sum(s.autovacuum_count), 0)::bigint
		FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
		WHERE n.nspname = $1 AND c.relkind IN ('r', 'm')`, m.cfg.schema).
		Scan(&s.TableBytes, &s.IndexBytes, &s.DeadTuples, &s.LiveTuples, &s.Autovacuums); err != nil {
		m.warnOnce(&m.sizeErr, "the size query", err)
	}
	if m.cfg.backlogSQL != "" {
		var n int64
		var age float64
		if err := m.conn.QueryRow(qctx, m.cfg.backlogSQL).Scan(&n, &age); err != nil {
			m.warnOnce(&m.backlogErr, "--backlog-sql", err)
		} else {
			s.DBBacklog, s.DBLag = &n, &age
		}
	}
	return s
}

func (m *monitor) warnOnce(seen *string, what string, err error) {
	if msg := err.Error(); msg != *seen {
		*seen = msg
		fmt.Fprintf(os.Stderr, "soak: %s: %v\n", what, err)
	}
}

// counts returns the reader's totals: lines, unique rows of the writer's,
// duplicates and foreign lines.
func (r *reader) counts() (lines, unique, dups, foreign int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.relayed, r.unique, r.dups, r.foreign
}

// takeLags returns the delivery lags recorded since the last call.
func (r *reader) takeLags() []float32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	lags := r.lags
	r.lags = make([]float32, 0, len(lags))
	return lags
}
