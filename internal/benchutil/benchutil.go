// Package benchutil holds what the drain benchmarks share: loading a backlog into
// an outbox, and reading this process's memory from /proc.
package benchutil

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
)

// Load writes n messages of payloadSize bytes over topics, interleaved, in chunks
// so the loader's memory is gone before a drain is measured, then vacuums the
// table as a steady-state outbox would be.
func Load(b testing.TB, tbl outbox.Table, n, payloadSize int, topics []string) {
	b.Helper()
	LoadHeaders(b, tbl, n, payloadSize, topics, nil)
}

// LoadHeaders is Load with headers on every row.
func LoadHeaders(b testing.TB, tbl outbox.Table, n, payloadSize int, topics []string, headers map[string]any) {
	b.Helper()
	w, err := outbox.NewWriter(tbl)
	if err != nil {
		b.Fatal(err)
	}
	payload := bytes.Repeat([]byte("x"), payloadSize)
	const chunk = 5000
	for i := 0; i < n; i += chunk {
		msgs := make([]outbox.Message, min(chunk, n-i))
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: topics[(i+j)%len(topics)], Payload: payload, Headers: headers}
		}
		if err := w.Write(context.Background(), dbtest.Pool(b), msgs...); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := dbtest.Pool(b).Exec(context.Background(), "VACUUM ANALYZE "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()); err != nil {
		b.Fatal(err)
	}
}

// Topics returns n topic names with prefix.
func Topics(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s.topic-%d", prefix, i)
	}
	return out
}

// ResetPeakRSS resets the kernel's high-water mark of this process's RSS.
func ResetPeakRSS(b testing.TB) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset peak RSS (%v): the figure includes loading", err)
	}
}

// ProcStatus returns a size field of /proc/self/status ("VmRSS:", "VmHWM:") in
// bytes.
func ProcStatus(b testing.TB, field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := bytes.CutPrefix(sc.Bytes(), []byte(field)); ok {
			kb, err := strconv.ParseInt(string(bytes.Fields(rest)[0]), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// Drain is a drain benchmark's body: for each of b.N runs it loads a fresh outbox
// with backlog messages of 512 bytes over topics, creates the producer with
// newProducer, drains the outbox with one Sweep configured by cfg (its Table is
// set here) and checks every row was dispatched. It reports msg/s (of the drains alone), the peak RSS during the
// drains, and the RSS before them.
func Drain(b *testing.B, backlog int, topics []string, cfg outbox.Config, newProducer func(b *testing.B) producer.Producer) {
	ctx := context.Background()
	var total time.Duration
	var peak, base int64
	for range b.N {
		b.StopTimer()
		tbl := dbtest.Table(b)
		Load(b, tbl, backlog, 512, topics)
		p := newProducer(b)
		pool := dbtest.NewPool(b, int32(max(cfg.Concurrency, outbox.ConcurrencyDefault)+2))
		cfg.Table = tbl
		s, err := outbox.NewSweeper(pool, p, cfg)
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		debug.FreeOSMemory()
		ResetPeakRSS(b)
		base = max(base, ProcStatus(b, "VmRSS:"))

		b.StartTimer()
		start := time.Now()
		res, err := s.Sweep(ctx)
		elapsed := time.Since(start)
		b.StopTimer()

		if err != nil {
			b.Fatal(err)
		}
		if res.Dispatched != backlog {
			b.Fatalf("dispatched %d of %d rows (failed topics %v)", res.Dispatched, backlog, res.FailedTopics)
		}
		total += elapsed
		peak = max(peak, ProcStatus(b, "VmHWM:"))
		if err := p.Close(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(backlog)*float64(b.N)/total.Seconds(), "msg/s")
	b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MB")
	b.ReportMetric(float64(base)/(1<<20), "RSS-before-MB") // the test binary and its pools, idle
	b.ReportMetric(0, "ns/op")                             // the drain rate is the figure; ns/op would include loading
}
