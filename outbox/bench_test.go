package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/benchutil"
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
			var prod *discard
			benchutil.Drain(b, backlog, benchutil.Topics("topic", 10), outbox.Config{}, func(*testing.B) producer.Producer {
				prod = &discard{}
				return prod
			})
			require.Equal(b, int64(backlog), prod.n.Load(), "the producer got every message")
		})
	}
}

// BenchmarkPageQuery times the sweeper's page query on outboxes of growing size,
// half of each already dispatched, and logs its plan: the partial index keeps its
// cost at the page, whatever the table holds.
func BenchmarkPageQuery(b *testing.B) {
	for _, size := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("rows=%d", size), func(b *testing.B) {
			ctx := context.Background()
			tbl := dbtest.Table(b)
			benchutil.Load(b, tbl, size, 512, benchutil.Topics("topic", 10))
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
