package bench_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-sweeper/sweeper/internal/benchutil"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
)

// BenchmarkDrainBinary drains 100,000 rows of 512 bytes over 10 topics through
// the sweeper binary as users run it (built without the race detector, the
// defaults, --producer stdout into /dev/null), and reports msg/s from its start
// to an empty outbox. With OUTBOX_BENCH_BASE set to a git revision it also
// builds that revision and alternates the two binaries, run after run, so that
// a machine whose speed drifts slows both alike; it then reports each one's
// median and the ratio new/base:
//
//	OUTBOX_BENCH_BASE=853bc78 go test -run '^$' -bench DrainBinary -benchtime 5x ./test/bench/
func BenchmarkDrainBinary(b *testing.B) {
	const backlog = 100_000
	bins := []string{build(b, "")}
	if base := os.Getenv("OUTBOX_BENCH_BASE"); base != "" {
		bins = append(bins, build(b, base))
	}
	rates := make([][]float64, len(bins))
	for i := range b.N {
		for k := range bins {
			j := (i + k) % len(bins) // alternate which goes first
			rates[j] = append(rates[j], drainOnce(b, bins[j], backlog))
		}
	}
	median := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		return s[len(s)/2]
	}
	b.ReportMetric(median(rates[0]), "msg/s")
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
}

// build builds the binary at rev (empty: this tree) and returns its path.
func build(b *testing.B, rev string) string {
	b.Helper()
	dir := b.TempDir()
	src := "../../cmd/sweeper"
	if rev != "" {
		tree := filepath.Join(dir, "tree")
		if out, err := exec.Command("git", "worktree", "add", "--detach", tree, rev).CombinedOutput(); err != nil {
			b.Fatalf("check out %s: %v\n%s", rev, err, out)
		}
		b.Cleanup(func() { _ = exec.Command("git", "worktree", "remove", "--force", tree).Run() })
		src = filepath.Join(tree, "cmd", "sweeper")
	}
	bin := filepath.Join(dir, "sweeper")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = src
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build the sweeper at %q: %v\n%s", rev, err, out)
	}
	return bin
}

// drainOnce loads a fresh backlog and returns the binary's drain rate.
func drainOnce(b *testing.B, bin string, backlog int) float64 {
	b.Helper()
	tbl := dbtest.Table(b)
	benchutil.Load(b, tbl, backlog, 512, benchutil.Topics("topic", 10))
	cmd := exec.Command(bin, "run", "--database-url", dbtest.URL(b), "--schema", tbl.Schema,
		"--admin-addr", "", "--log-level", "warn")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	cmd.Stderr = os.Stderr // stdout: the messages, into /dev/null
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill() })
	for dbtest.Outstanding(b, tbl) > 0 {
		if time.Since(start) > 5*time.Minute {
			b.Fatal("the backlog did not drain in 5 minutes")
		}
		time.Sleep(20 * time.Millisecond) // the poll's pace: it bounds the figure's resolution (0.4 % of a 5 s drain), not its outcome
	}
	elapsed := time.Since(start)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		b.Fatalf("sweeper exit: %v", err)
	}
	return float64(backlog) / elapsed.Seconds()
}
