package benchutil

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// writeOne commits one row in a transaction of its own, storing the time just
// before the commit in committing.
func writeOne(ctx context.Context, pool *pgxpool.Pool, w *outbox.Writer, topic string, seq int, committing *atomic.Int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // a no-op after the commit
	if err := w.Write(ctx, tx, outbox.Message{Topic: topic, Payload: strconv.AppendInt(nil, int64(seq), 10)}); err != nil {
		return err
	}
	committing.Store(time.Now().UnixNano())
	return tx.Commit(ctx)
}

// LatencyResult is what Latency measured: every row's time from just before its
// transaction's commit to its arrival at a subscriber, sorted.
type LatencyResult struct {
	Rows      int
	Latencies []time.Duration
	// FromAck is every row's time from the moment its commit returned to the
	// writer, sorted; negative when the row arrived first. The true commit lies
	// between the two clocks, so Latencies is an upper bound and FromAck a
	// lower one; their difference in the tail is time spent committing.
	FromAck []time.Duration
	// Commits is every row's commit as its writer saw it, sorted: what the
	// database alone took, the floor under Latencies.
	Commits    []time.Duration
	WriteRate  float64 // rows per second the writers achieved
	Duplicates int
}

// MergeLatency pools the rows of several runs, as if measured in one: the
// quantiles of windows that bracket another, so that the machine's drift over
// a run weighs on both sides of a ratio.
func MergeLatency(rs ...LatencyResult) LatencyResult {
	var out LatencyResult
	var seconds float64
	for _, r := range rs {
		out.Rows += r.Rows
		out.Duplicates += r.Duplicates
		out.Latencies = append(out.Latencies, r.Latencies...)
		out.FromAck = append(out.FromAck, r.FromAck...)
		out.Commits = append(out.Commits, r.Commits...)
		if r.WriteRate > 0 {
			seconds += float64(r.Rows) / r.WriteRate
		}
	}
	if seconds > 0 {
		out.WriteRate = float64(out.Rows) / seconds
	}
	slices.Sort(out.Latencies)
	slices.Sort(out.FromAck)
	slices.Sort(out.Commits)
	return out
}

// Quantile returns the q-quantile (0 < q ≤ 1) of the latencies.
func (r LatencyResult) Quantile(q float64) time.Duration { return quantile(r.Latencies, q) }

// QuantileFromAck returns the q-quantile of FromAck.
func (r LatencyResult) QuantileFromAck(q float64) time.Duration { return quantile(r.FromAck, q) }

// QuantileCommit returns the q-quantile of Commits.
func (r LatencyResult) QuantileCommit(q float64) time.Duration { return quantile(r.Commits, q) }

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// NATSStream creates a file-backed JetStream stream capturing prefix.> for a
// test, keeping its newest maxMsgs messages, so the sweeper's publishes are
// acknowledged, and returns the topics to write.
func NATSStream(tb testing.TB, url, prefix string, topics int, maxMsgs int64) []string {
	tb.Helper()
	nc, err := natsgo.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	brokertest.CreateStream(tb, js, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}, MaxMsgs: maxMsgs})
	return Topics(prefix, topics)
}

// Subscriber starts receiving what the sweeper relays, calling arrived with each
// message's body as it comes, and returns a function that stops it. It is
// ready when it returns: nothing published after that is missed.
type Subscriber func(tb testing.TB, arrived func(body []byte)) (stop func())

// NATSSubscriber subscribes to prefix.> on the NATS server at url.
func NATSSubscriber(url, prefix string) Subscriber {
	return func(tb testing.TB, arrived func([]byte)) func() {
		nc, err := natsgo.Connect(url)
		if err != nil {
			tb.Fatal(err)
		}
		sub, err := nc.Subscribe(prefix+".>", func(m *natsgo.Msg) { arrived(m.Data) })
		if err != nil {
			tb.Fatal(err)
		}
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			tb.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			tb.Fatal(err)
		}
		return nc.Close
	}
}

// RabbitMQSubscriber consumes, with automatic acks, a queue of its own bound to
// prefix.# on exchange (a topic exchange it declares, deleted at cleanup) of
// the RabbitMQ at url.
func RabbitMQSubscriber(url, exchange, prefix string) Subscriber {
	return func(tb testing.TB, arrived func([]byte)) func() {
		ch := brokertest.RabbitMQExchange(tb, url, exchange)
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			tb.Fatal(err)
		}
		if err := ch.QueueBind(q.Name, prefix+".#", exchange, false, nil); err != nil {
			tb.Fatal(err)
		}
		deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
		if err != nil {
			tb.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for d := range deliveries {
				arrived(d.Body)
			}
		}()
		return func() {
			_ = ch.Close() // ends deliveries; the queue goes with it (exclusive)
			<-done
		}
	}
}

// warmUp is the payload of the rows Latency writes before its clock starts.
const warmUp = "warm-up"

// Latency writes rate single-row transactions a second for d into tbl, spread
// over topics, from enough goroutines to keep the pace, while a sweeper someone
// else runs relays them to the broker sub receives from. The clock starts just
// before each commit is sent, so a figure includes the commit's round trip and
// never flatters. It fails tb if a row has not arrived 30s after the last
// write.
func Latency(tb testing.TB, tbl outbox.Table, sub Subscriber, topics []string, rate int, d time.Duration) LatencyResult {
	tb.Helper()
	return LatencyTables(tb, dbtest.NewPool(tb, 16), []outbox.Table{tbl}, sub, topics, rate, d)
}

// LatencyTables is Latency over several outboxes (tenants) on pool's
// database, which must allow 16 connections: the rows go to tbls in turn,
// each table's spread over topics.
func LatencyTables(tb testing.TB, pool *pgxpool.Pool, tbls []outbox.Table, sub Subscriber, topics []string, rate int, d time.Duration) LatencyResult {
	tb.Helper()
	n := int(d.Seconds() * float64(rate))
	committing := make([]atomic.Int64, n) // unix nanos just before each row's commit
	committed := make([]atomic.Int64, n)  // unix nanos when its commit returned
	arrived := make([]atomic.Int64, n)    // unix nanos of its first arrival
	var received, dups, warm atomic.Int64
	warmed := make(chan struct{})

	stop := sub(tb, func(body []byte) {
		now := time.Now().UnixNano()
		if string(body) == warmUp {
			if warm.Add(1) == int64(len(topics)*len(tbls)) {
				close(warmed)
			}
			return
		}
		seq, err := strconv.Atoi(string(body))
		if err != nil || seq < 0 || seq >= n {
			tb.Errorf("unexpected message %q", body)
			return
		}
		if arrived[seq].CompareAndSwap(0, now) {
			received.Add(1)
		} else {
			dups.Add(1)
		}
	})
	defer stop()

	writers := make([]*outbox.Writer, len(tbls))
	for i, tbl := range tbls {
		w, err := outbox.NewWriter(tbl)
		if err != nil {
			tb.Fatal(err)
		}
		writers[i] = w
	}
	var err error
	// Warm up before the clock starts: the writers' connections open (16
	// handshakes at once would slow the first second), and one row per topic
	// goes through the sweeper, so that it has started, reached the broker,
	// and met every topic. Then it is left to fall asleep as it would.
	conns := make([]*pgxpool.Conn, 16)
	for i := range conns {
		if conns[i], err = pool.Acquire(context.Background()); err != nil {
			tb.Fatal(err)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	for _, w := range writers {
		for _, topic := range topics {
			if err := w.Write(context.Background(), pool, outbox.Message{Topic: topic, Payload: []byte(warmUp)}); err != nil {
				tb.Fatal(err)
			}
		}
	}
	select {
	case <-warmed:
	case <-time.After(30 * time.Second):
		tb.Fatalf("%d of %d warm-up rows arrived within 30s", warm.Load(), len(topics)*len(tbls))
	}
	seqs := make(chan int, rate)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for range 16 {
		wg.Go(func() {
			ctx := context.Background()
			// After a failure the workers drain the queue without writing,
			// so the pacing loop never blocks on a full channel.
			for seq := range seqs {
				if failed.Load() {
					continue
				}
				w, topic := writers[seq%len(writers)], topics[(seq/len(writers))%len(topics)]
				if err := writeOne(ctx, pool, w, topic, seq, &committing[seq]); err != nil {
					tb.Errorf("write row %d: %v", seq, err)
					failed.Store(true)
					continue
				}
				committed[seq].Store(time.Now().UnixNano())
			}
		})
	}
	begin := time.Now()
	interval := time.Second / time.Duration(rate)
	for seq := range n {
		if wait := time.Until(begin.Add(time.Duration(seq) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		seqs <- seq
	}
	close(seqs)
	wg.Wait()
	writeRate := float64(n) / time.Since(begin).Seconds()
	if tb.Failed() {
		tb.FailNow()
	}

	deadline := time.Now().Add(30 * time.Second)
	for received.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := received.Load(); got < int64(n) {
		tb.Fatalf("%d of %d rows arrived within 30s of the last write", got, n)
	}
	res := LatencyResult{Rows: n, WriteRate: writeRate, Duplicates: int(dups.Load()),
		Latencies: make([]time.Duration, n), FromAck: make([]time.Duration, n), Commits: make([]time.Duration, n)}
	for i := range n {
		res.Latencies[i] = time.Duration(arrived[i].Load() - committing[i].Load())
		res.FromAck[i] = time.Duration(arrived[i].Load() - committed[i].Load())
		res.Commits[i] = time.Duration(committed[i].Load() - committing[i].Load())
	}
	slices.Sort(res.Latencies)
	slices.Sort(res.FromAck)
	slices.Sort(res.Commits)
	return res
}
