package outbox_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxsql "github.com/outbox-sweeper/sweeper/sql"
)

// discard accepts every batch and counts the messages: the benchmark measures the
// relay, not a broker.
type discard struct{ n atomic.Int64 }

func (d *discard) Batches(_ context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	return []producer.Batch{{Topic: topic, Messages: msgs}}, nil
}
func (d *discard) Send(_ context.Context, b producer.Batch) error {
	d.n.Add(int64(len(b.Messages)))
	return nil
}
func (d *discard) Close(context.Context) error { return nil }

// BenchmarkDrain drains a pre-loaded backlog of 512-byte messages over 10 topics
// and reports messages per second and the process's peak RSS during the drain.
// Run it through `make bench`, which fixes -benchtime=1x and -count=3 and prints
// the median with benchstat.
func BenchmarkDrain(b *testing.B) {
	for _, backlog := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) {
			benchmarkDrain(b, backlog, outbox.Config{})
		})
	}
}

func benchmarkDrain(b *testing.B, backlog int, cfg outbox.Config) {
	ctx := context.Background()
	var total time.Duration
	var peak, base int64
	for range b.N {
		b.StopTimer()
		tbl := dbtest.Table(b)
		load(b, tbl, backlog)
		runtime.GC()
		debug.FreeOSMemory()
		resetPeakRSS(b)
		base = max(base, procStatus(b, "VmRSS:"))
		prod := &discard{}
		cfg.Table = tbl
		pool := dbtest.NewPool(b, int32(outbox.ConcurrencyDefault+2))
		s, err := outbox.NewSweeper(pool, prod, cfg)
		require.NoError(b, err)

		b.StartTimer()
		start := time.Now()
		res, err := s.Sweep(ctx)
		elapsed := time.Since(start)
		b.StopTimer()

		require.NoError(b, err)
		require.Equal(b, backlog, res.Dispatched)
		require.Equal(b, int64(backlog), prod.n.Load())
		total += elapsed
		peak = max(peak, procStatus(b, "VmHWM:"))
	}
	b.ReportMetric(float64(backlog)*float64(b.N)/total.Seconds(), "msg/s")
	b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MB")
	b.ReportMetric(float64(base)/(1<<20), "RSS-before-MB") // the test binary and its pools, idle
	b.ReportMetric(0, "ns/op")                             // the drain rate is the figure; ns/op would include loading
}

// load writes n 512-byte messages over 10 topics, interleaved, in chunks so the
// loader's memory is gone before the drain is measured.
func load(b *testing.B, tbl outbox.Table, n int) {
	w, err := outbox.NewWriter(tbl)
	require.NoError(b, err)
	payload := bytes.Repeat([]byte("x"), 512)
	const chunk = 5000
	for i := 0; i < n; i += chunk {
		msgs := make([]outbox.Message, min(chunk, n-i))
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: fmt.Sprintf("topic-%d", (i+j)%10), Payload: payload}
		}
		require.NoError(b, w.Write(context.Background(), dbtest.Pool(b), msgs...))
	}
	_, err = dbtest.Pool(b).Exec(context.Background(), "VACUUM ANALYZE "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize())
	require.NoError(b, err)
}

// resetPeakRSS resets the kernel's high-water mark of this process's RSS.
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("cannot reset peak RSS (%v): the figure includes loading", err)
	}
}

// procStatus returns a size field of /proc/self/status (VmRSS, VmHWM) in bytes.
func procStatus(b *testing.B, field string) int64 {
	f, err := os.Open("/proc/self/status")
	require.NoError(b, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := bytes.CutPrefix(sc.Bytes(), []byte(field)); ok {
			kb, err := strconv.ParseInt(string(bytes.Fields(rest)[0]), 10, 64)
			require.NoError(b, err)
			return kb << 10
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// BenchmarkPageQuery times the sweeper's page query on outboxes of growing size,
// half of each already dispatched, and logs its plan: the partial index keeps its
// cost at the page, whatever the table holds.
func BenchmarkPageQuery(b *testing.B) {
	for _, size := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("rows=%d", size), func(b *testing.B) {
			ctx := context.Background()
			tbl := dbtest.Table(b)
			load(b, tbl, size)
			ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
			pool := dbtest.Pool(b)
			_, err := pool.Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() WHERE id <= $1", size/2)
			require.NoError(b, err)
			_, err = pool.Exec(ctx, "VACUUM ANALYZE "+ident)
			require.NoError(b, err)

			query := outboxsql.Statement("page_outstanding", ident, "")
			args := []any{outbox.PageSizeDefault, []string{}, int64(0)}
			rows, err := pool.Query(ctx, "EXPLAIN "+query, args...)
			require.NoError(b, err)
			plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(b, err)
			b.Logf("plan with %d rows, %d outstanding:\n%s", size, size/2, strings.Join(plan, "\n"))

			for b.Loop() {
				rows, err := pool.Query(ctx, query, args...)
				require.NoError(b, err)
				n := 0
				for rows.Next() {
					n++
				}
				require.NoError(b, rows.Err())
				require.Equal(b, outbox.PageSizeDefault, n)
			}
		})
	}
}
