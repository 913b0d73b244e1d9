package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

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

// BenchmarkDrainTracing drains 100,000 rows with tracing off (Config.Tracer
// nil, as the binary runs without OTEL_* set) and on (the SDK sampling every
// span into a batch processor whose exporter drops them), in the same run:
// the ratio is the cost of a span per batch. The rows carry no trace
// context, so no links are made; reading a row's headers for one costs a
// byte search.
func BenchmarkDrainTracing(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			var cfg outbox.Config
			if on {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(dropSpans{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
				defer tp.Shutdown(context.Background())
				cfg.Tracer = tp.Tracer("bench")
			}
			var prod *discard
			benchutil.Drain(b, 100_000, benchutil.Topics("topic", 10), cfg, func(*testing.B) producer.Producer {
				prod = &discard{}
				return prod
			})
			require.Equal(b, int64(100_000), prod.n.Load())
		})
	}
}

// dropSpans is an exporter that drops what it is given.
type dropSpans struct{}

func (dropSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (dropSpans) Shutdown(context.Context) error                             { return nil }

// recording accepts every batch and keeps the ids it was sent, so that the
// instances benchmark can count rows sent twice.
type recording struct {
	mu  sync.Mutex
	ids []int64
	n   *atomic.Int64 // shared by the instances: when it reaches the backlog, the drain is done
}

func (r *recording) Batches(_ context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	return []producer.Batch{{Topic: topic, Messages: msgs}}, nil
}
func (r *recording) Send(_ context.Context, b producer.Batch) error {
	r.mu.Lock()
	for _, m := range b.Messages {
		r.ids = append(r.ids, m.ID)
	}
	r.mu.Unlock()
	r.n.Add(int64(len(b.Messages)))
	return nil
}
func (r *recording) Close(context.Context) error { return nil }

// BenchmarkDrainInstances drains 100,000 rows of 512 bytes over 20 topics with
// 1, 2 and 3 sweepers on the table, each with its own pool, running as they do
// in production (Run, the default 1s tick, wake-ups on), under both orderings.
// It reports msg/s from the sweepers' start to the last row's acceptance, and
// fails on a row sent twice. The sweepers share this process and the machine's
// two cores with Postgres, so the figure shows where the database becomes the
// limit rather than what more machines would give.
func BenchmarkDrainInstances(b *testing.B) {
	const backlog = 100_000
	for _, ordering := range []outbox.Ordering{outbox.OrderingTopic, outbox.OrderingNone} {
		for _, instances := range []int{1, 2, 3} {
			b.Run(fmt.Sprintf("ordering=%s/instances=%d", ordering, instances), func(b *testing.B) {
				var total time.Duration
				for range b.N {
					tbl := dbtest.Table(b)
					benchutil.Load(b, tbl, backlog, 512, benchutil.Topics("topic", 20))
					var sent atomic.Int64
					prods := make([]*recording, instances)
					sweepers := make([]*outbox.Sweeper, instances)
					for i := range sweepers {
						prods[i] = &recording{n: &sent}
						s, err := outbox.NewSweeper(dbtest.NewPool(b, outbox.ConcurrencyDefault+2), prods[i], outbox.Config{Table: tbl, Ordering: ordering})
						require.NoError(b, err)
						sweepers[i] = s
					}
					start := time.Now()
					for _, s := range sweepers {
						dbtest.RunSweeper(b, s)
					}
					for sent.Load() < backlog {
						time.Sleep(time.Millisecond)
					}
					total += time.Since(start)
					seen := make(map[int64]bool, backlog)
					for _, p := range prods {
						p.mu.Lock()
						for _, id := range p.ids {
							if seen[id] {
								b.Fatalf("row %d sent twice", id)
							}
							seen[id] = true
						}
						p.mu.Unlock()
					}
					require.Len(b, seen, backlog)
				}
				b.ReportMetric(float64(backlog)*float64(b.N)/total.Seconds(), "msg/s")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkPageQuery times the sweeper's page claim (claim_page.sql, rolled
// back after each run, so every run claims the same rows) and logs its plan: on
// outboxes of growing size, half of each already dispatched (the partial index
// keeps its cost at the page, whatever the table holds), and with 1,000 tripped
// topics beside the 10 live ones against the same outbox without them. The
// page query reads only the live topics; the tripped ones are left out when the
// tick lists its topics, which BenchmarkTopicsQuery times.
func BenchmarkPageQuery(b *testing.B) {
	for _, tc := range pageQueryCases {
		b.Run(tc.name, func(b *testing.B) { benchmarkPageQuery(b, tc) })
	}
}

func benchmarkPageQuery(b *testing.B, tc pageQueryCase) {
	ctx := context.Background()
	ident, excluded := pageQuerySetup(b, tc)
	pool := dbtest.Pool(b)
	rows, err := pool.Query(ctx, outboxsql.Statement("outstanding_topics", outboxsql.Tables{Outbox: ident}), excluded)
	require.NoError(b, err)
	live, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b, err)
	require.Len(b, live, 10)

	query := outboxsql.Statement("claim_page", outboxsql.Tables{Outbox: ident})
	args := []any{live, make([]int64, len(live)), make([]int64, len(live)), outbox.PageSizeDefault / len(live), false, "20000ms"}
	rows, err = pool.Query(ctx, "EXPLAIN "+query, args...)
	require.NoError(b, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b, err)
	b.Logf("page claim plan for %s:\n%s", tc.name, strings.Join(plan, "\n"))

	for b.Loop() {
		tx, err := pool.Begin(ctx)
		require.NoError(b, err)
		rows, err := tx.Query(ctx, query, args...)
		require.NoError(b, err)
		n := 0
		for rows.Next() {
			n++
		}
		require.NoError(b, rows.Err())
		require.NoError(b, tx.Rollback(ctx))
		require.Equal(b, outbox.PageSizeDefault+len(live), n, "the page's rows and a summary row per topic")
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

var pageQueryCases = []pageQueryCase{
	{name: "rows=10000", size: 10_000},
	{name: "rows=100000", size: 100_000},
	{name: "rows=100000/tripped=0", size: 100_000},
	{name: "rows=100000/tripped=1000", size: 100_000, tripped: 1000},
}

type pageQueryCase struct {
	name    string
	size    int
	tripped int
	// dispatched is how many more rows, already dispatched, the table keeps
	// (as it does until retention deletes them), written before the others.
	dispatched int
}

// BenchmarkPageQueryRetained times the page query on 10,000 rows, half of them
// outstanding, alone and with 10,000,000 dispatched rows kept in the table
// before them:
// the partial indexes hold outstanding rows only, so the second should cost
// what the first does. Loading the 10,000,000 rows takes a few minutes.
func BenchmarkPageQueryRetained(b *testing.B) {
	for _, tc := range []pageQueryCase{
		{name: "dispatched=0", size: 10_000},
		{name: "dispatched=10000000", size: 10_000, dispatched: 10_000_000},
	} {
		b.Run(tc.name, func(b *testing.B) { benchmarkPageQuery(b, tc) })
	}
}

// pageQuerySetup loads an outbox for a page query case and returns its quoted
// name and the topics to exclude: 1,000 more topics with 50 rows each when the
// case trips them.
func pageQuerySetup(b *testing.B, tc pageQueryCase) (string, []string) {
	ctx := context.Background()
	tbl := dbtest.Table(b)
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	pool := dbtest.Pool(b)
	for done := 0; done < tc.dispatched; done += 1_000_000 {
		_, err := pool.Exec(ctx, "INSERT INTO "+ident+" (topic, payload, dispatched_at) "+
			"SELECT 'topic.topic-' || (g % 10), '\\x00', now() FROM generate_series(1, $1) g", min(1_000_000, tc.dispatched-done))
		require.NoError(b, err)
	}
	benchutil.Load(b, tbl, tc.size, 512, benchutil.Topics("topic", 10))
	// Half of the loaded rows dispatched, the other half outstanding.
	_, err := pool.Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() WHERE dispatched_at IS NULL AND id < "+
		"(SELECT min(id) FROM "+ident+" WHERE dispatched_at IS NULL) + $1", tc.size/2)
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
// page, no call to the broker. The design asks for well under a millisecond.
func BenchmarkBlockedTick(b *testing.B) {
	tbl := dbtest.Table(b)
	benchutil.Load(b, tbl, 1000, 512, benchutil.Topics("topic", 10))
	prod := memory.New(memory.Config{})
	dep := brokerBreaker(b, breaker.DependencyConfig{Failures: 1, OpenDuration: time.Hour})
	failBroker(b, dep, 1)
	s, err := outbox.NewSweeper(dbtest.Pool(b), prod, outbox.Config{Table: tbl, BrokerBreaker: dep,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1_000_000})})
	require.NoError(b, err)
	require.Equal(b, breaker.DependencyOpen, dep.State())
	for b.Loop() {
		res, err := s.Sweep(context.Background())
		if err != nil || !res.Blocked {
			b.Fatalf("tick not blocked: %+v, %v", res, err)
		}
	}
}

// BenchmarkWriteMessageIDIndex measures what the unique index on message_id
// (migration 5) costs writers: one message per transaction, and Writer.Write of
// 100 (the multi-row INSERT) and 1,000 messages (COPY) per transaction. Each
// iteration commits one such transaction into an outbox with the index and one
// into an outbox without it (dropped after migrating), in turns, the first of
// the pair alternating, so both see the same machine. Both start empty and grow
// alike; message ids are the database's or the Writer's random UUIDs, as an
// application's would be. It reports the time per row with and without the
// index, and their ratio (BENCHMARKS.md, "Unique message_id").
func BenchmarkWriteMessageIDIndex(b *testing.B) {
	for _, rows := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			with, without := messageIDIndexPair(b)
			benchmarkWriteMessageIDIndex(b, with, without, rows, false)
		})
	}
}

// BenchmarkWriteMessageIDIndexRetained is the 1,000-message write of
// BenchmarkWriteMessageIDIndex into outboxes that already keep 5,000,000
// dispatched rows, as they do until retention deletes them. The index (logged;
// about 200 MB) then outgrows Debian's default shared_buffers (128 MB). With
// random ids (the database's and the Writer's version 4 UUIDs) each lands on a
// random leaf page; with time-ordered ones (version 7, set by the application)
// they land on the last few. Loading the rows takes minutes.
func BenchmarkWriteMessageIDIndexRetained(b *testing.B) {
	for _, ids := range []string{"random", "time-ordered"} {
		b.Run("ids="+ids, func(b *testing.B) {
			const retained = 5_000_000
			ctx := context.Background()
			with, without := messageIDIndexPair(b)
			pool := dbtest.Pool(b)
			for _, tbl := range []outbox.Table{with, without} {
				ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
				for done := 0; done < retained; done += 1_000_000 {
					_, err := pool.Exec(ctx, "INSERT INTO "+ident+" (topic, payload, dispatched_at) "+
						"SELECT 'topic.topic-' || (g % 10), '\\x00', now() FROM generate_series(1, $1) g", min(1_000_000, retained-done))
					require.NoError(b, err)
				}
				_, err := pool.Exec(ctx, "VACUUM ANALYZE "+ident)
				require.NoError(b, err)
			}
			var size string
			require.NoError(b, pool.QueryRow(ctx, "SELECT pg_size_pretty(pg_relation_size($1::regclass))",
				pgx.Identifier{with.Schema, with.Name + "_message_id_key"}.Sanitize()).Scan(&size))
			b.Logf("message_id index of %d rows: %s", retained, size)
			benchmarkWriteMessageIDIndex(b, with, without, 1000, ids == "time-ordered")
		})
	}
}

// benchmarkWriteMessageIDIndex writes rows messages per transaction into with
// and without in turns, and reports the time per row of each. With v7 each
// pair of writes gives its messages new version 7 ids (the same in both
// tables), made before the clock starts; without, the ids are left to the
// Writer and the database.
func benchmarkWriteMessageIDIndex(b *testing.B, with, without outbox.Table, rows int, v7 bool) {
	ctx := context.Background()
	w := [2]*outbox.Writer{}
	for i, tbl := range []outbox.Table{with, without} {
		var err error
		w[i], err = outbox.NewWriter(tbl)
		require.NoError(b, err)
	}
	payload := strings.Repeat("x", 512)
	msgs := make([]outbox.Message, rows)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: fmt.Sprintf("topic-%d", i%10), Payload: []byte(payload)}
	}
	pool := dbtest.Pool(b)
	var took [2]time.Duration
	for n := 0; b.Loop(); n++ {
		for i := range msgs {
			if v7 {
				msgs[i].MessageID = uuid.Must(uuid.NewV7()).String()
			} else {
				msgs[i].MessageID = uuid.NewString() // random, as gen_random_uuid() makes for SQL writers
			}
		}
		for k := range 2 {
			i := (n + k) % 2 // with first on even iterations, without first on odd ones
			start := time.Now()
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return w[i].Write(ctx, tx, msgs...) })
			took[i] += time.Since(start)
			require.NoError(b, err)
		}
	}
	reportMessageIDIndex(b, took, b.N*rows)
}

// BenchmarkSweepMessageIDIndex measures what the unique index costs the sweeper:
// marking a row dispatched updates an indexed column (the partial indexes'
// dispatched_at), so the new row version also gets an entry in the message_id
// index, with its uniqueness check. Each iteration loads 10,000 rows of 512
// bytes over 10 topics into a fresh outbox with the index and one without, then
// drains each with one Sweep into a producer that accepts everything, in turns
// as above. It reports the time per row with and without, and their ratio.
func BenchmarkSweepMessageIDIndex(b *testing.B) {
	const backlog = 10_000
	ctx := context.Background()
	var took [2]time.Duration
	for n := 0; b.Loop(); n++ {
		b.StopTimer()
		with, without := messageIDIndexPair(b)
		var sweepers [2]*outbox.Sweeper
		for i, tbl := range []outbox.Table{with, without} {
			benchutil.Load(b, tbl, backlog, 512, benchutil.Topics("topic", 10))
			s, err := outbox.NewSweeper(dbtest.Pool(b), &discard{}, outbox.Config{Table: tbl})
			require.NoError(b, err)
			sweepers[i] = s
		}
		b.StartTimer()
		for k := range 2 {
			i := (n + k) % 2
			start := time.Now()
			res, err := sweepers[i].Sweep(ctx)
			took[i] += time.Since(start)
			require.NoError(b, err)
			require.Equal(b, backlog, res.Dispatched)
		}
	}
	reportMessageIDIndex(b, took, b.N*backlog)
}

// messageIDIndexPair returns two fresh outboxes, the first with the unique
// index on message_id, the second without it.
func messageIDIndexPair(b *testing.B) (with, without outbox.Table) {
	with, without = dbtest.Table(b), dbtest.Table(b)
	_, err := dbtest.Pool(b).Exec(context.Background(), "DROP INDEX "+pgx.Identifier{without.Schema, without.Name + "_message_id_key"}.Sanitize())
	require.NoError(b, err)
	return with, without
}

// reportMessageIDIndex reports the time per row with the index (took[0]) and
// without it (took[1]), and their ratio, in place of ns/op (which would add the
// two).
func reportMessageIDIndex(b *testing.B, took [2]time.Duration, rows int) {
	b.ReportMetric(float64(took[0].Nanoseconds())/float64(rows), "ns/row-with")
	b.ReportMetric(float64(took[1].Nanoseconds())/float64(rows), "ns/row-without")
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "with/without")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkStatusQuery times what GET /status asks the database: each topic's
// outstanding rows and the age of its oldest, and the dead letters by topic
// and reason, at 1,000 topics and a backlog of 1,000,000 rows (loading them
// takes a minute). The first reads every outstanding row's index entry, so it
// grows with the backlog: the figure says what a page polling /status every
// few seconds costs the database at that depth.
func BenchmarkStatusQuery(b *testing.B) {
	for _, backlog := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("topics=1000/backlog=%d", backlog), func(b *testing.B) {
			ctx := context.Background()
			tbl := dbtest.Table(b)
			benchutil.Load(b, tbl, backlog, 512, benchutil.Topics("topic", 1000))
			_, err := dbtest.Pool(b).Exec(ctx, "ANALYZE "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize())
			require.NoError(b, err)
			bl, err := outbox.NewBacklog(dbtest.Pool(b), tbl)
			require.NoError(b, err)
			for b.Loop() {
				topics, err := bl.Topics(ctx)
				require.NoError(b, err)
				require.Len(b, topics, 1000)
				_, err = bl.DeadLetters(ctx)
				require.NoError(b, err)
			}
		})
	}
}

// BenchmarkExpiryTick is what expiry adds to a tick while the broker is down
// (the broker breaker open: every topic is left out, so every topic is
// probed), over 1,000 topics and a backlog of which nothing has expired yet,
// against the same blocked tick without a max age (the pass then reads the
// partial index of rows with an expires_at only). A blocked tick did nothing
// else before expiry existed.
func BenchmarkExpiryTick(b *testing.B) {
	for _, backlog := range []int{10_000, 1_000_000} {
		ctx := context.Background()
		tbl := dbtest.Table(b)
		benchutil.Load(b, tbl, backlog, 512, benchutil.Topics("topic", 1000))
		_, err := dbtest.Pool(b).Exec(ctx, "ANALYZE "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize())
		require.NoError(b, err)
		for _, maxAge := range []time.Duration{0, time.Hour} {
			b.Run(fmt.Sprintf("topics=1000/backlog=%d/max-age=%s", backlog, maxAge), func(b *testing.B) {
				broker := breaker.NewDependency(breaker.DependencyConfig{Failures: 1, OpenDuration: time.Hour})
				defer broker.Close(ctx)
				done, err := broker.Allow()
				require.NoError(b, err)
				done(breaker.BrokerDown, errors.New("down"))
				s, err := outbox.NewSweeper(dbtest.Pool(b), &discard{}, outbox.Config{Table: tbl, BrokerBreaker: broker, MaxAge: maxAge})
				require.NoError(b, err)
				for b.Loop() {
					res, err := s.Sweep(ctx)
					require.NoError(b, err)
					require.True(b, res.Blocked)
					require.Zero(b, res.Expired)
				}
			})
		}
	}
}
