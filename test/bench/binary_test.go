package bench_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-sweeper/sweeper/internal/benchutil"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// BenchmarkDrainBinary drains 100,000 rows of 512 bytes over 10 topics through
// the sweeper binary as users run it (built without the race detector, its
// defaults, started and timed until the outbox is empty), into stdout (into
// /dev/null), RabbitMQ and NATS JetStream. In each run it also measures, on
// the same machine and in the same minute, the ceilings of
// test/bench/ceiling: what the database does alone (claiming, marking and
// reading back the rows in 1,000-row statements) and what the broker does
// alone (a plain publisher with the same delivery guarantee). Both share the
// machine's cores with whatever relays between them, so the best a relay can
// do here is the combined ceiling, 1 / (1/database + 1/broker); the figure
// that matters is the binary's share of it, "of-ceiling".
//
// With OUTBOX_BENCH_BASE set to a git revision it also builds that revision
// and alternates the two binaries, run after run, so that a machine whose
// speed drifts slows both alike, and reports the base's rate and new/base:
//
//	OUTBOX_BENCH_BASE=0b8cd58 go test -run '^$' -bench DrainBinary -benchtime 3x ./test/bench/
func BenchmarkDrainBinary(b *testing.B) {
	bins := []string{build(b, "", "cmd/sweeper")}
	if base := os.Getenv("OUTBOX_BENCH_BASE"); base != "" {
		bins = append(bins, build(b, base, "cmd/sweeper"))
	}
	ceiling := build(b, "", "test/bench/ceiling")
	for _, t := range []struct {
		producer string
		// setup readies the broker for 10 topics under prefix and returns them,
		// with the arguments of the sweeper and of the broker's ceiling.
		setup func(b *testing.B, prefix string) (topics, sweeperArgs, ceilingArgs []string)
	}{
		{"stdout", func(b *testing.B, prefix string) ([]string, []string, []string) {
			return benchutil.Topics(prefix, 10), []string{"--producer", "stdout"}, []string{"stdout"}
		}},
		{"rabbitmq", func(b *testing.B, prefix string) ([]string, []string, []string) {
			url := brokertest.RabbitMQURL(b)
			topics := benchutil.Topics(prefix, 10)
			exchange := rabbitTopology(b, url, topics)
			return topics, []string{"--producer", "rabbitmq", "--rabbitmq-url", url, "--rabbitmq-exchange", exchange},
				[]string{"rabbitmq", "--url", url, "--exchange", exchange}
		}},
		{"nats", func(b *testing.B, prefix string) ([]string, []string, []string) {
			url := brokertest.NATSURL(b)
			return benchutil.NATSStream(b, url, prefix, 10, 20_000),
				[]string{"--producer", "nats", "--nats-url", url}, []string{"nats", "--url", url}
		}},
	} {
		b.Run("producer="+t.producer, func(b *testing.B) {
			topics, sweeperArgs, ceilingArgs := t.setup(b, brokertest.Name("binary"))
			ceilingArgs = append(ceilingArgs, "--topics", strings.Join(topics, ","), "--messages", strconv.Itoa(backlog), "--size", "512")
			rates := make([][]float64, len(bins))
			var dbRates, brokerRates, shares []float64
			for i := range b.N {
				dbRates = append(dbRates, dbCeiling(b, ceiling, topics))
				brokerRates = append(brokerRates, runCeiling(b, ceiling, ceilingArgs...))
				for k := range bins {
					j := (i + k) % len(bins) // alternate which goes first
					rates[j] = append(rates[j], drainOnce(b, bins[j], topics, sweeperArgs))
				}
				combined := 1 / (1/dbRates[i] + 1/brokerRates[i])
				shares = append(shares, rates[0][i]/combined)
				b.Logf("run %d: binary %.0f msg/s, database %.0f, broker %.0f, combined %.0f: %.2f of the ceiling",
					i+1, rates[0][i], dbRates[i], brokerRates[i], combined, shares[i])
			}
			b.ReportMetric(median(rates[0]), "msg/s")
			b.ReportMetric(median(dbRates), "db-msg/s")
			b.ReportMetric(median(brokerRates), "broker-msg/s")
			b.ReportMetric(median(shares), "of-ceiling")
			if len(bins) > 1 {
				b.ReportMetric(median(rates[1]), "base-msg/s")
				ratios := make([]float64, len(rates[0]))
				for i := range ratios {
					ratios[i] = rates[0][i] / rates[1][i]
				}
				b.ReportMetric(median(ratios), "new/base")
				b.Logf("new %v\nbase %v", rates[0], rates[1])
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// build builds the package at pkg (a path in the module) at rev (empty: this
// tree) without the race detector and returns the binary's path.
func build(b *testing.B, rev, pkg string) string {
	b.Helper()
	dir := b.TempDir()
	src := filepath.Join("..", "..", pkg)
	if rev != "" {
		tree := filepath.Join(dir, "tree")
		if out, err := exec.Command("git", "worktree", "add", "--detach", tree, rev).CombinedOutput(); err != nil {
			b.Fatalf("check out %s: %v\n%s", rev, err, out)
		}
		b.Cleanup(func() { _ = exec.Command("git", "worktree", "remove", "--force", tree).Run() })
		src = filepath.Join(tree, pkg)
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build %s at %q: %v\n%s", pkg, rev, err, out)
	}
	return bin
}

// sweeperCmd is the sweeper binary bin's run on tbl's schema, as users run it
// (its defaults, no admin API, warnings and errors only, on stderr) with args
// added. Its stdout, the stdout producer's messages, goes to /dev/null.
func sweeperCmd(b *testing.B, bin string, tbl outbox.Table, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, append([]string{"run", "--database-url", dbtest.URL(b), "--schema", tbl.Schema,
		"--admin-addr", "", "--log-level", "warn"}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Stderr = os.Stderr
	return cmd
}

// runCeiling runs the ceiling program and returns its rate.
func runCeiling(b *testing.B, bin string, args ...string) float64 {
	b.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr // stdout: the stdout ceiling's messages, into /dev/null
	if err := cmd.Run(); err != nil {
		b.Fatalf("ceiling %v: %v\n%s", args, err, stderr.String())
	}
	var out struct {
		Messages int
		Seconds  float64
	}
	if err := json.Unmarshal(bytes.TrimSpace(stderr.Bytes()), &out); err != nil || out.Messages == 0 {
		b.Fatalf("ceiling %v printed %q: %v", args, stderr.String(), err)
	}
	return float64(out.Messages) / out.Seconds
}

// dbCeiling loads a fresh backlog and returns the database ceiling's rate on it.
func dbCeiling(b *testing.B, bin string, topics []string) float64 {
	b.Helper()
	tbl := dbtest.Table(b)
	benchutil.Load(b, tbl, backlog, 512, topics)
	rate := runCeiling(b, bin, "db", "--database-url", dbtest.URL(b), "--table", tbl.String())
	if n := dbtest.Outstanding(b, tbl); n != 0 {
		b.Fatalf("the database ceiling left %d rows outstanding", n)
	}
	return rate
}

// drainOnce loads a fresh backlog and returns the binary's drain rate, from its
// start to an empty outbox.
func drainOnce(b *testing.B, bin string, topics, args []string) float64 {
	b.Helper()
	tbl := dbtest.Table(b)
	benchutil.Load(b, tbl, backlog, 512, topics)
	return float64(backlog) / drain(b, bin, tbl, 5*time.Minute, nil, args...).Seconds()
}

// drain runs bin with args on tbl's backlog until the outbox is empty, calls
// drained (if set) with the process still running, stops it, and returns the
// time from its start to the empty outbox. It fails b past limit.
func drain(b *testing.B, bin string, tbl outbox.Table, limit time.Duration, drained func(pid int), args ...string) time.Duration {
	b.Helper()
	cmd := sweeperCmd(b, bin, tbl, args...)
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill() }) // after a failure; a no-op once it has exited
	for first, ok := dbtest.FirstOutstanding(b, tbl, 0); ok; first, ok = dbtest.FirstOutstanding(b, tbl, first) {
		if time.Since(start) > limit {
			b.Fatalf("the backlog did not drain in %s", limit)
		}
		time.Sleep(20 * time.Millisecond) // the poll's pace: it bounds the figure's resolution (0.4 % of a 5 s drain), not its outcome
	}
	elapsed := time.Since(start)
	if drained != nil {
		drained(cmd.Process.Pid)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		b.Fatalf("sweeper exit: %v", err)
	}
	return elapsed
}

// BenchmarkDrainBinaryHeaders drains 100,000 rows of 512 bytes over 10
// topics, each row with two headers (a string and a number), through the
// binary into RabbitMQ, NATS JetStream and Kafka (kfake, a process of its
// own), and with OUTBOX_BENCH_BASE set alternates it with that revision's
// binary, run after run, reporting new/base: issue 34's A/B of mapping each
// row once.
//
//	OUTBOX_BENCH_BASE=1cbc9a7 go test -run '^$' -bench DrainBinaryHeaders -benchtime 5x ./test/bench/
func BenchmarkDrainBinaryHeaders(b *testing.B) {
	bins := []string{build(b, "", "cmd/sweeper")}
	if base := os.Getenv("OUTBOX_BENCH_BASE"); base != "" {
		bins = append(bins, build(b, base, "cmd/sweeper"))
	}
	headers := map[string]any{"tenant": "acme", "seq": 12345}
	for _, t := range []struct {
		producer string
		setup    func(b *testing.B, prefix string) (topics, args []string)
	}{
		{"rabbitmq", func(b *testing.B, prefix string) ([]string, []string) {
			url := brokertest.RabbitMQURL(b)
			topics := benchutil.Topics(prefix, 10)
			return topics, []string{"--producer", "rabbitmq", "--rabbitmq-url", url, "--rabbitmq-exchange", rabbitTopology(b, url, topics)}
		}},
		{"nats", func(b *testing.B, prefix string) ([]string, []string) {
			url := brokertest.NATSURL(b)
			return benchutil.NATSStream(b, url, prefix, 10, 20_000), []string{"--producer", "nats", "--nats-url", url}
		}},
		{"kafka", func(b *testing.B, prefix string) ([]string, []string) {
			topics := benchutil.Topics(prefix, 10)
			addr := brokertest.StartKafka(b, "--topics", strings.Join(topics, ","), "--partitions", "3").Addr
			return topics, []string{"--producer", "kafka", "--kafka-brokers", addr}
		}},
	} {
		b.Run("producer="+t.producer, func(b *testing.B) {
			topics, args := t.setup(b, brokertest.Name("headers"))
			rates := make([][]float64, len(bins))
			for i := range b.N {
				for k := range bins {
					j := (i + k) % len(bins) // alternate which goes first
					tbl := dbtest.Table(b)
					benchutil.LoadHeaders(b, tbl, backlog, 512, topics, headers)
					rates[j] = append(rates[j], float64(backlog)/drain(b, bins[j], tbl, 5*time.Minute, nil, args...).Seconds())
				}
			}
			b.ReportMetric(median(rates[0]), "msg/s")
			if len(bins) > 1 {
				ratios := make([]float64, len(rates[0]))
				for i := range ratios {
					ratios[i] = rates[0][i] / rates[1][i]
				}
				b.ReportMetric(median(rates[1]), "base-msg/s")
				b.ReportMetric(median(ratios), "new/base")
				b.Logf("new %.0f\nbase %.0f", rates[0], rates[1])
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
