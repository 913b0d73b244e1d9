// Command soak runs the sweeper binary the way it lives in production (issue
// 32; DESIGN.md, "It lives for months"): for minutes at a steady rate, on a
// Postgres with its production defaults (autovacuum on), while a session holds
// the horizon back, and measures whether it keeps pace and what it leaves in
// the table.
//
//	soak [phases|clean|step|ceiling] [flags]
//
// Every mode starts a Postgres cluster of its own (initdb and pg_ctl from
// --pg-bin into a temporary directory, a free port, initdb's settings), runs
// the binary given by --bin (`migrate`, then `run --producer stdout`), and
// stops the cluster and removes it at the end, on an error or on Ctrl-C.
//
//   - phases (the default): the ceilings below, then three phases of --phase
//     each at --rate: clean; a REPEATABLE READ session that has read something,
//     held open (it holds the snapshot, so no row version the relay leaves
//     behind can be removed); recovery after it ends.
//   - clean: one clean phase of --clean (30 minutes).
//   - step: offers --step-start rows/s, then --step-by more each --step-hold
//     (5 minutes), until a step's lag exceeds --lag-limit (1s) or the writer
//     cannot offer the rate; reports the highest rate held.
//   - ceiling: only the ceilings: the minimal table's claim-and-mark rate on one
//     connection, and the binary's drain of a --drain-rows backlog at its
//     default tick and at --tick 50ms (--drain-runs of each, alternating,
//     medians), as ratios to it, in the same cluster.
//
// Lag is measured end to end, so that it holds for any storage layout: the
// writer puts "soak <txn> <row>" at the head of each payload and notes when
// each transaction's commit returned; the harness reads the binary's standard
// output (the stdout producer's JSON lines) through a pipe and takes, for each
// row, its arrival less its commit. Backlog is the rows committed less those
// arrived. The lag figure is the age of the oldest committed row not yet
// arrived. The database's own view (--backlog-sql) is sampled beside it.
//
// Samples every --sample (2s) go to --out as JSON lines; the summary goes to
// standard error as a table, and to standard output as benchmark lines
// (benchstat reads them; `make bench` appends them to bench.out).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

type config struct {
	mode        string
	bin         string
	pgBin       string
	sweeperArgs []string
	migrateArgs []string
	rate        int
	txRows      int
	size        int
	topics      int
	conns       int
	phase       time.Duration
	clean       time.Duration
	sample      time.Duration
	insert      string
	backlogSQL  string
	schema      string
	out         string
	ceiling     bool
	drainRows   int
	drainRuns   int
	drainLimit  time.Duration
	stepStart   int
	stepBy      int
	stepHold    time.Duration
	stepMax     int
	lagLimit    time.Duration
	tail        time.Duration
	pgOpts      string
	pgLog       string
}

func (c *config) topicNames() []string {
	out := make([]string, c.topics)
	for i := range out {
		out[i] = fmt.Sprintf("soak.topic-%d", i)
	}
	return out
}

// baseArgs are the sweeper's flags in every run: the stdout producer (read by
// the harness), no admin API (its port could be taken), warnings only.
var baseArgs = []string{"--producer", "stdout", "--admin-addr", "", "--log-level", "warn"}

// soakArgs are added for the soak's runs: retention as the issue sets it, so
// that dispatched rows are deleted while the soak runs.
var soakArgs = []string{"--retention", "1m", "--retention-schedule", "@every 10s"}

func main() {
	mode := "phases"
	args := os.Args[1:]
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		mode, args = args[0], args[1:]
	}
	cfg := &config{mode: mode}
	fs := flag.NewFlagSet("soak "+mode, flag.ExitOnError)
	fs.StringVar(&cfg.bin, "bin", "bin/sweeper", "the sweeper binary under test")
	fs.StringVar(&cfg.pgBin, "pg-bin", "/usr/lib/postgresql/15/bin", "where initdb and pg_ctl are")
	sweeperArgs := fs.String("sweeper-args", "", "more flags for `sweeper run`, shell-quoted (they come last, so they override the harness's: e.g. --tick 100ms or --retention 5m)")
	migrateArgs := fs.String("migrate-args", "", "more flags for `sweeper migrate` (and run), shell-quoted, e.g. --schema s --table t")
	fs.IntVar(&cfg.rate, "rate", 3000, "rows offered a second (phases, clean)")
	fs.IntVar(&cfg.txRows, "tx-rows", 5, "rows per transaction (at most 8)")
	fs.IntVar(&cfg.size, "size", 512, "payload bytes")
	fs.IntVar(&cfg.topics, "topics", 10, "topics, used in turn")
	fs.IntVar(&cfg.conns, "conns", 4, "the writer's connections")
	fs.DurationVar(&cfg.phase, "phase", 2*time.Minute, "each phase's length (phases)")
	fs.DurationVar(&cfg.clean, "clean", 30*time.Minute, "the clean run's length (clean)")
	fs.DurationVar(&cfg.sample, "sample", 2*time.Second, "interval between samples")
	fs.StringVar(&cfg.insert, "insert", "INSERT INTO public.outbox (topic, payload) SELECT * FROM unnest($1::text[], $2::bytea[])",
		"the writer's statement: $1 topics (text[]), $2 payloads (bytea[]); change it with the storage layout")
	fs.StringVar(&cfg.backlogSQL, "backlog-sql", "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 FROM public.outbox WHERE dispatched_at IS NULL",
		"the database's view of the backlog: one row of (rows bigint, oldest age in seconds float8); empty: not sampled")
	fs.StringVar(&cfg.schema, "schema", "public", "the schema whose tables' sizes and dead tuples are sampled")
	fs.StringVar(&cfg.out, "out", "soak-samples.out", "the samples and summaries, as JSON lines (.out: ignored by git)")
	fs.BoolVar(&cfg.ceiling, "ceiling", true, "phases and step: measure the ceilings first")
	fs.IntVar(&cfg.drainRows, "drain-rows", 100_000, "the ceilings' backlog")
	fs.IntVar(&cfg.drainRuns, "drain-runs", 3, "the binary's drains at each tick, alternating; their medians are reported")
	fs.DurationVar(&cfg.drainLimit, "drain-limit", 5*time.Minute, "fail a drain that takes longer")
	fs.IntVar(&cfg.stepStart, "step-start", 3000, "step: the first rate, rows/s")
	fs.IntVar(&cfg.stepBy, "step-by", 1500, "step: added each step, rows/s")
	fs.DurationVar(&cfg.stepHold, "step-hold", 5*time.Minute, "step: each step's length")
	fs.IntVar(&cfg.stepMax, "step-max", 60_000, "step: stop after this rate")
	fs.DurationVar(&cfg.lagLimit, "lag-limit", time.Second, "step: a step is held when the lag never exceeds this; and the recovery's target")
	fs.DurationVar(&cfg.tail, "tail", time.Minute, "after the last phase, how long to wait for every row to arrive")
	fs.StringVar(&cfg.pgOpts, "pg-opts", "", "more server settings for diagnosis, as postgres takes them, e.g. "+
		"'-c shared_preload_libraries=auto_explain -c auto_explain.log_min_duration=100' (figures are for the defaults)")
	fs.StringVar(&cfg.pgLog, "pg-log", "", "copy the server's log here when the soak ends (.out: ignored by git)")
	_ = fs.Parse(args)
	var err error
	if cfg.sweeperArgs, err = splitArgs(*sweeperArgs); err == nil {
		cfg.migrateArgs, err = splitArgs(*migrateArgs)
	}
	if err == nil && (cfg.txRows < 1 || cfg.txRows > 8) {
		err = fmt.Errorf("--tx-rows is %d: 1 to 8", cfg.txRows)
	}
	if err == nil && cfg.size < 32 {
		err = fmt.Errorf("--size is %d: at least 32 (the payload's head names the row)", cfg.size)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg *config) error {
	switch cfg.mode {
	case "phases", "clean", "step", "ceiling":
	default:
		return fmt.Errorf("unknown mode %q: phases, clean, step or ceiling", cfg.mode)
	}
	if _, err := os.Stat(cfg.bin); err != nil {
		return fmt.Errorf("the binary: %w (make build makes bin/sweeper)", err)
	}
	out, err := os.Create(cfg.out)
	if err != nil {
		return err
	}
	defer out.Close()
	enc := json.NewEncoder(out)

	cl, err := startCluster(ctx, cfg.pgBin, cfg.pgOpts, cfg.pgLog)
	if err != nil {
		return err
	}
	defer cl.stop()
	settings, err := cl.settings(ctx)
	if err != nil {
		return err
	}
	version, _ := exec.Command(cfg.bin, "version").CombinedOutput()
	head := map[string]any{"type": "start", "time": time.Now().UTC().Format(time.RFC3339), "mode": cfg.mode,
		"bin": cfg.bin, "version": strings.TrimSpace(string(version)), "postgres": settings,
		"sweeper_args": append(append(append([]string{}, baseArgs...), soakArgs...), cfg.sweeperArgs...),
		"rate":         cfg.rate, "tx_rows": cfg.txRows, "size": cfg.size, "topics": cfg.topics, "conns": cfg.conns,
		"insert": cfg.insert, "backlog_sql": cfg.backlogSQL}
	_ = enc.Encode(head)
	fmt.Fprintf(os.Stderr, "soak %s: %s (%s), Postgres %s at 127.0.0.1:%d in %s, autovacuum %s\n", cfg.mode, cfg.bin,
		head["version"], settings["server_version"], cl.port, cl.dir, settings["autovacuum"])

	if cfg.mode == "ceiling" || (cfg.mode != "clean" && cfg.ceiling) {
		c, err := ceilings(ctx, cfg, cl)
		if err != nil {
			return fmt.Errorf("ceilings: %w (server log:\n%s)", err, cl.tailLog(20))
		}
		_ = enc.Encode(c)
		c.print()
	}
	var plan func(done []summary) (phase, bool)
	switch cfg.mode {
	case "ceiling":
		return nil
	case "phases":
		plan = func(done []summary) (phase, bool) {
			ps := []phase{{name: "clean", dur: cfg.phase, rate: cfg.rate},
				{name: "hold", dur: cfg.phase, rate: cfg.rate, hold: true},
				{name: "recovery", dur: cfg.phase, rate: cfg.rate}}
			if len(done) == len(ps) {
				return phase{}, false
			}
			return ps[len(done)], true
		}
	case "clean":
		plan = func(done []summary) (phase, bool) {
			return phase{name: "clean-" + cfg.clean.String(), dur: cfg.clean, rate: cfg.rate}, len(done) == 0
		}
	case "step":
		plan = func(done []summary) (phase, bool) {
			rate := cfg.stepStart
			if n := len(done); n > 0 {
				if !done[n-1].held(cfg.lagLimit) {
					return phase{}, false
				}
				rate = done[n-1].TargetRate + cfg.stepBy
			}
			if rate > cfg.stepMax {
				return phase{}, false
			}
			return phase{name: fmt.Sprintf("step-%d", rate), dur: cfg.stepHold, rate: rate}, true
		}
	}
	sums, err := soak(ctx, cfg, cl, enc, plan)
	if len(sums) > 0 {
		printSummaries(cfg, sums)
		for _, s := range sums {
			_ = enc.Encode(s)
		}
	}
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return errors.New("interrupted")
		}
		return fmt.Errorf("%w (server log:\n%s)", err, cl.tailLog(20))
	}
	return nil
}

// migrate runs the binary's migrate on url.
func migrate(ctx context.Context, cfg *config, url string) error {
	cmd := exec.CommandContext(ctx, cfg.bin, append([]string{"migrate", "--database-url", url}, cfg.migrateArgs...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s migrate: %v\n%s", cfg.bin, err, out)
	}
	return nil
}

// splitArgs splits a command line as a shell would for words, single and
// double quotes and backslashes (no expansions).
func splitArgs(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	var quote rune
	escaped := false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case quote != 0:
			if r == quote {
				quote = 0
			} else if r == '\\' && quote == '"' {
				escaped = true
			} else {
				cur.WriteRune(r)
			}
		case r == '\\':
			escaped, inWord = true, true
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 || escaped {
		return nil, fmt.Errorf("unterminated quote or escape in %q", s)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}
