package outbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/benchutil"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// BenchmarkSplit times one sweep of a 500-row batch (one topic, one page, one
// batch) into the memory producer: clean, and with one row that fails every
// send unclassified, which the sweep must isolate by splitting the batch and
// charge alone. The difference is the cost of finding a bad row: the failed
// sends (about log₂ 500 of them) and a claim-send-record transaction for each
// half. It reports the sweep's time (ms/sweep; loading the rows is left out)
// and the sends each sweep made.
func BenchmarkSplit(b *testing.B) {
	for _, bad := range []bool{false, true} {
		name := "clean"
		if bad {
			name = "one-bad-row"
		}
		b.Run(name, func(b *testing.B) {
			tbl := dbtest.Table(b)
			sends := 0
			var swept time.Duration
			for range b.N {
				if _, err := dbtest.Pool(b).Exec(context.Background(), "TRUNCATE "+tbl.String()+" RESTART IDENTITY"); err != nil {
					b.Fatal(err)
				}
				benchutil.Load(b, tbl, 500, 512, []string{"split"})
				prod := memory.New(memory.Config{MaxBatch: 500})
				if bad {
					prod.FailMessage(317, errors.New("unclassified"))
				}
				s, err := outbox.NewSweeper(dbtest.Pool(b), prod, outbox.Config{Table: tbl, Ordering: outbox.OrderingNone,
					Retry: breaker.Retry{Attempts: 1}, TopicBackoffMax: -1, DisableNotify: true, Tick: time.Hour})
				if err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				res, err := s.Sweep(context.Background())
				swept += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				want := 500
				if bad {
					want = 499
				}
				if res.Dispatched != want {
					b.Fatalf("dispatched %d, want %d: %+v", res.Dispatched, want, res)
				}
				sends += prod.Calls()
			}
			// The loading is most of the wall time: report the sweep's own.
			b.ReportMetric(float64(swept.Microseconds())/1000/float64(b.N), "ms/sweep")
			b.ReportMetric(float64(sends)/float64(b.N), "sends/op")
			b.ReportMetric(0, "ns/op")
		})
	}
}
