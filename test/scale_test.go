package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// rabbitArgs are the flags that run the binary on tbl into RabbitMQ.
func rabbitArgs(t *testing.T, tbl outbox.Table, url, exchange string, extra ...string) []string {
	t.Helper()
	return append([]string{"run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema,
		"--producer", "rabbitmq", "--rabbitmq-url", url, "--rabbitmq-exchange", exchange}, extra...)
}

// Three processes of the binary on one table with --ordering topic, while the
// application writes: 50,000 rows over 20 topics arrive once each, each topic in
// id order, and every instance takes part.
func TestThreeInstancesKeepTopicOrderAndSendNothingTwice(t *testing.T) {
	t.Parallel()
	const n = 50_000
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_three")
	topics := topicNames("three", 20)
	rc := consumeRabbitMQ(t, url, exchange, topics)
	tbl := migrated(t)

	var procs []*proc
	for range 3 {
		procs = append(procs, start(t, nil, rabbitArgs(t, tbl, url, exchange,
			"--ordering", "topic", "--tick", "100ms", "--log-level", "debug")...))
	}
	// Every instance sweeping before the rows come, however long each takes
	// to start, so that all three compete for the topics.
	for i, p := range procs {
		dbtest.Eventually(t, 2*time.Minute, fmt.Sprintf("instance %d started", i), func() bool {
			return strings.Contains(p.Stderr(), "sweeper started")
		})
	}
	ids := writeRoundTrip(t, tbl, topics, n) // 50 transactions of 1,000 rows
	dbtest.Eventually(t, 5*time.Minute, "every message consumed", func() bool { return rc.count() >= n })
	for _, p := range procs {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	}
	for i, p := range procs {
		require.Equal(t, 0, p.wait(t, time.Minute), "instance %d exit code", i)
		require.Contains(t, p.Stderr(), "batch dispatched", "instance %d sent nothing: topics were not spread", i)
	}
	require.Zero(t, dbtest.Outstanding(t, tbl))
	rc.drain(t) // deliveries still on their way would be duplicates
	checkRoundTrip(t, rc.snapshot(), ids, topics, n)
}

// lockedRows counts the outstanding rows of tbl that page transactions hold
// locked: in flight, at most, when an instance is killed. It locks the
// others for the moment of its statement (the sweepers' claims skip them).
func lockedRows(t *testing.T, tbl outbox.Table) int {
	t.Helper()
	var n int
	require.NoError(t, pgx.BeginFunc(context.Background(), dbtest.Pool(t), func(tx pgx.Tx) error {
		return tx.QueryRow(context.Background(), "SELECT (SELECT count(*) FROM "+tbl.Ident()+") - (SELECT count(*) FROM (SELECT 1 FROM "+
			tbl.Ident()+" FOR UPDATE SKIP LOCKED) free)").Scan(&n)
	}))
	return max(n, 0)
}

// Chaos: two instances of the binary relay to RabbitMQ while the application
// writes 50,000 rows in transactions of 1 to 50 rows, and one instance or the
// other is killed with SIGKILL at random moments, at least 20 times, each
// restarted at once. Every committed row arrives at least once; duplicates are
// counted and reported.
func TestChaosKilledInstancesLoseNothing(t *testing.T) {
	t.Parallel()
	const (
		n         = 50_000
		minKills  = 20
		writeTime = 20 * time.Second // the writer's pace spreads the rows over it
	)
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_chaos")
	topics := topicNames("chaos", 10)
	rc := consumeRabbitMQ(t, url, exchange, topics)
	tbl := migrated(t)
	args := rabbitArgs(t, tbl, url, exchange, "--tick", "100ms", "--page-size", "200")
	deadline := time.Now().Add(5 * time.Minute) // for the chaos; the drain has its own

	// The application: transactions of 1 to 50 rows, at a pace that spreads n
	// rows over writeTime, each row with a seq header for checkRoundTrip.
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	var written atomic.Int64
	writerDone, stopWriting := make(chan struct{}), make(chan struct{})
	// A test that fails midway must stop the writer before its schema goes.
	t.Cleanup(func() { close(stopWriting); <-writerDone })
	go func() {
		defer close(writerDone)
		rng := rand.New(rand.NewPCG(1, 2))
		begin := time.Now()
		for i := 0; i < n; {
			select {
			case <-stopWriting:
				return
			default:
			}
			size := min(1+rng.IntN(50), n-i)
			msgs := make([]outbox.Message, size)
			for j := range msgs {
				topic := topics[(i+j)%len(topics)]
				msgs[j] = outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, "%s/%d", topic, i+j),
					Headers: map[string]any{"seq": i + j, "source": "round-trip"}, CorrelationID: fmt.Sprintf("corr-%d", i+j)}
			}
			if err := w.Write(context.Background(), dbtest.Pool(t), msgs...); err != nil {
				t.Errorf("application write: %v", err)
				return
			}
			i += size
			written.Store(int64(i))
			// Paces the writes to spread them over writeTime; a slow
			// machine writes later, which the chaos loop waits for.
			if ahead := time.Duration(i)*writeTime/n - time.Since(begin); ahead > 0 {
				time.Sleep(ahead)
			}
		}
	}()

	procs := []*proc{start(t, nil, args...), start(t, nil, args...)}
	kills, inFlight := 0, 0
	rng := rand.New(rand.NewPCG(3, 4))
	for kills < minKills || written.Load() < n {
		require.True(t, time.Now().Before(deadline), "chaos did not finish in time: %d kills, %d rows written", kills, written.Load())
		select {
		case <-writerDone:
			require.False(t, t.Failed(), "the application's writes failed")
		default:
		}
		// The next kill comes after a random share of the relay (250 to
		// 2,500 messages, half a second or so at the writer's pace), so that
		// each lands in the middle of the run whatever the machine's speed;
		// or at once when there is nothing left to relay.
		target := rc.count() + 250 + rng.IntN(2250)
		dbtest.Eventually(t, 2*time.Minute, "the relay moving on before the next kill", func() bool {
			if rc.count() >= target {
				return true
			}
			select {
			case <-writerDone:
				return dbtest.Outstanding(t, tbl) == 0
			default:
				return false
			}
		})
		// And what may be claimed before the kill lands: a transaction
		// claims up to 8 pages (outbox's pagesPerTransaction), one ahead of
		// another, in each of the 2 lanes; a page a lane was too little
		// when the test's goroutine waited for the CPU before the kill.
		inFlight += lockedRows(t, tbl) + 2*8*200
		i := rng.IntN(len(procs))
		require.NoError(t, procs[i].cmd.Process.Kill())
		procs[i].wait(t, time.Minute)
		procs[i] = start(t, nil, args...)
		kills++
	}
	<-writerDone
	require.False(t, t.Failed())

	dbtest.Eventually(t, 5*time.Minute, "every row dispatched and consumed", func() bool {
		return dbtest.Outstanding(t, tbl) == 0 && rc.distinct() >= n
	})
	for _, p := range procs {
		require.Equal(t, 0, p.terminate(t, time.Minute))
	}
	rc.drain(t) // redeliveries still on their way count among the duplicates

	got := rc.snapshot()
	seen := map[float64]int{}
	for _, topic := range topics {
		for _, m := range got[topic] {
			require.NotEqual(t, -1.0, m.seq, "a header was lost")
			seen[m.seq]++
		}
	}
	dups := 0
	for seq := range n {
		c := seen[float64(seq)]
		require.Positive(t, c, "row with seq %d never arrived", seq)
		dups += c - 1
	}
	t.Logf("%d SIGKILLs over %d rows: every row arrived; %d arrived more than once (%.2f%%, at-least-once), %.0f a kill",
		kills, n, dups, 100*float64(dups)/n, float64(dups)/float64(kills))
	// A kill can send again only the rows the killed instance had in
	// flight: those its page transactions held locked.
	t.Logf("rows locked by the instances at the kills: %d in all", inFlight)
	require.LessOrEqual(t, dups, inFlight, "more duplicates than the rows in flight at the kills")
	require.GreaterOrEqual(t, kills, minKills)
	require.NotContains(t, strings.Join([]string{procs[0].Stderr(), procs[1].Stderr()}, ""), "panic")
}
