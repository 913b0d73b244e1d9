package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/benchutil"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
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

// BenchmarkPageQuery times the sweeper's page query and logs its plan: on
// outboxes of growing size, half of each already dispatched (the partial index
// keeps its cost at the page, whatever the table holds), and with 1,000 tripped
// topics beside the 10 live ones against the same outbox without them. The
// page query reads only the live topics; the tripped ones are left out when the
// tick lists its topics, which BenchmarkTopicsQuery times.
func BenchmarkPageQuery(b *testing.B) {
	for _, tc := range pageQueryCases {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			ident, excluded := pageQuerySetup(b, tc)
			pool := dbtest.Pool(b)
			rows, err := pool.Query(ctx, outboxsql.Statement("outstanding_topics", outboxsql.Tables{Outbox: ident}), excluded)
			require.NoError(b, err)
			live, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(b, err)
			require.Len(b, live, 10)

			query := outboxsql.Statement("page_outstanding", outboxsql.Tables{Outbox: ident})
			args := []any{live, make([]int64, len(live)), outbox.PageSizeDefault / len(live)}
			rows, err = pool.Query(ctx, "EXPLAIN "+query, args...)
			require.NoError(b, err)
			plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(b, err)
			b.Logf("page query plan for %s:\n%s", tc.name, strings.Join(plan, "\n"))

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

// BenchmarkTopicsQuery times the query each tick starts with: the topics with
// outstanding rows, less the tripped ones. It costs an index seek per distinct
// topic, tripped or not, and nothing per row.
func BenchmarkTopicsQuery(b *testing.B) {
	for _, tc := range pageQueryCases[2:] {
		b.Run(tc.name, func(b *testing.B) {
			ctx := context.Background()
			ident, excluded := pageQuerySetup(b, tc)
			query := outboxsql.Statement("outstanding_topics", outboxsql.Tables{Outbox: ident})
			for b.Loop() {
				rows, err := dbtest.Pool(b).Query(ctx, query, excluded)
				require.NoError(b, err)
				live, err := pgx.CollectRows(rows, pgx.RowTo[string])
				require.NoError(b, err)
				require.Len(b, live, 10)
			}
		})
	}
}

var pageQueryCases = []struct {
	name    string
	size    int
	tripped int
}{
	{"rows=10000", 10_000, 0},
	{"rows=100000", 100_000, 0},
	{"rows=100000/tripped=0", 100_000, 0},
	{"rows=100000/tripped=1000", 100_000, 1000},
}

// pageQuerySetup loads an outbox for a page query case and returns its quoted
// name and the topics to exclude: 1,000 more topics with 50 rows each when the
// case trips them.
func pageQuerySetup(b *testing.B, tc struct {
	name    string
	size    int
	tripped int
}) (string, []string) {
	ctx := context.Background()
	tbl := dbtest.Table(b)
	benchutil.Load(b, tbl, tc.size, 512, benchutil.Topics("topic", 10))
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	pool := dbtest.Pool(b)
	_, err := pool.Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() WHERE id <= $1", tc.size/2)
	require.NoError(b, err)
	excluded := make([]string, tc.tripped)
	for i := range excluded {
		excluded[i] = fmt.Sprintf("tripped-%04d", i)
	}
	if tc.tripped > 0 {
		_, err = pool.Exec(ctx, "INSERT INTO "+ident+" (topic, payload) SELECT t, '\\x00' FROM unnest($1::text[]) t, generate_series(1, 50)", excluded)
		require.NoError(b, err)
	}
	_, err = pool.Exec(ctx, "VACUUM ANALYZE "+ident)
	require.NoError(b, err)
	return ident, excluded
}

// BenchmarkBlockedTick times a tick while the dependency breaker is open: no
// page, no call to the broker. DESIGN.md asks for well under a millisecond.
func BenchmarkBlockedTick(b *testing.B) {
	tbl := dbtest.Table(b)
	benchutil.Load(b, tbl, 1000, 512, benchutil.Topics("topic", 10))
	prod := memory.New(memory.Config{})
	prod.FailNextCalls(1_000_000, errors.New("connection refused"))
	guarded := breaker.Guard(prod, breaker.DependencyConfig{Failures: 1, RetryAttempts: 1, OpenDuration: time.Hour})
	b.Cleanup(func() { _ = guarded.Close(context.Background()) })
	s, err := outbox.NewSweeper(dbtest.Pool(b), guarded, outbox.Config{Table: tbl,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1_000_000})})
	require.NoError(b, err)
	_, err = s.Sweep(context.Background()) // fails, and opens the breaker
	require.NoError(b, err)
	require.True(b, guarded.Blocked())
	for b.Loop() {
		res, err := s.Sweep(context.Background())
		if err != nil || !res.Blocked {
			b.Fatalf("tick not blocked: %+v, %v", res, err)
		}
	}
}
