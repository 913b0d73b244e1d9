package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

func countTopic(msgs []producer.Message, topic string) int {
	n := 0
	for _, m := range msgs {
		if m.Topic == topic {
			n++
		}
	}
	return n
}

// The ADR's scenario: topic A has 200 outstanding rows that always fail (the
// entity refuses us), topic B 100 good rows with higher ids, and a page holds
// 100. Every B row is delivered within 2 ticks; A is tripped at its first
// failure; A's rows are outstanding, none lost, and none charged an attempt:
// the topic is wrong, not the rows.
func TestADRScenarioFailingTopicDoesNotStallOthers(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 200)...)
	writeMessages(t, tbl, topicMessages("B", 100)...)
	prod := memory.New(memory.Config{MaxBatch: 50})
	prod.FailTopic("A", producer.NewTopicError("unauthorized", errors.New("unauthorized for entity A")))
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 100})

	for range 2 {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
	}
	require.Equal(t, 100, countTopic(prod.Messages(), "B"), "every B row within 2 ticks")
	require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("A"))

	rows := readRows(t, tbl)
	require.Len(t, rows, 300, "none lost")
	for _, r := range rows {
		if r.Topic == "A" {
			require.False(t, r.Dispatched)
			require.Zero(t, r.Attempts, "row %d", r.ID)
		}
	}
	require.Contains(t, s.TopicBreaker().Tripped()[0].LastError, "unauthorized for entity A", "the operator sees why")
	require.Equal(t, 1, prod.Calls()-2, "A was tried once: B's 100 rows went in 2 batches")
}

// Through the sweeper: a topic tripped with cooldown 3 is left out for exactly 3
// ticks, then sends one trial batch; a failing trial trips it for 6; a
// succeeding one closes it and the rest of its rows go.
func TestCooldownThroughTheSweeper(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 30)...)
	prod := memory.New(memory.Config{MaxBatch: 10})
	prod.FailTopic("A", producer.NewTopicError("not_found", errors.New("no entity A")))
	b := breaker.New(breaker.Settings{CooldownTicks: 3})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b})
	sweep := sweeps(t, s)

	sweep() // tick 1: A fails and trips
	require.Equal(t, 1, prod.Calls())
	for range 3 { // ticks 2, 3 and 4: the cooldown of 3
		sweep()
		require.Equal(t, 1, prod.Calls(), "A left out while tripped")
	}
	res := sweep() // tick 5: the cooldown is over: one trial batch, which fails
	require.Equal(t, 2, prod.Calls())
	require.Equal(t, 1, res.Batches, "a half-open topic sends one batch")
	require.Equal(t, 6, b.Tripped()[0].CooldownTicksLeft, "a failed trial doubles the cooldown")

	prod.HealTopic("A")
	for range 6 {
		sweep()
	}
	require.Equal(t, 2, prod.Calls(), "still cooling down")
	res = sweep() // the seventh tick after the failed trial: the next trial succeeds
	require.Equal(t, 10, res.Dispatched, "only the trial batch in the half-open tick")
	require.Equal(t, breaker.StateClosed, b.State("A"))
	res = sweep()
	require.Equal(t, 20, res.Dispatched, "closed: the rest goes")
	require.Zero(t, dbtest.Outstanding(t, tbl))
}

func TestTopicClassErrorTripsAtOnceWhateverTheThreshold(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 5)...)
	writeMessages(t, tbl, topicMessages("T", 5)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("A", errors.New("connection reset")) // transient
	prod.FailTopic("T", producer.NewTopicError("not_found", errors.New("no such entity")))
	b := breaker.New(breaker.Settings{FailureThreshold: 5})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b})
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, breaker.StateTripped, b.State("T"))
	require.Equal(t, breaker.StateClosed, b.State("A"), "one transient failure of five")
}

// Fair paging: a healthy topic with a deep backlog of older rows does not fill
// every page: the first page already carries the other topic's rows.
func TestDeepBacklogDoesNotFillEveryPage(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("deep", 1000)...)
	writeMessages(t, tbl, topicMessages("small", 10)...)
	prod := memory.New(memory.Config{})
	var firstBatches []producer.Batch
	prod.SetSendFunc(func(_ context.Context, b producer.Batch) error {
		if len(firstBatches) < 2 {
			firstBatches = append(firstBatches, b)
		}
		return nil
	})
	// One lane: the page shared between the topics is the point. (With two
	// lanes each topic pages in its own, at once.)
	s := outbox.OneLane(newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 100, Concurrency: 1}))
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1010, res.Dispatched)
	var topics []string
	for _, b := range firstBatches {
		topics = append(topics, b.Topic)
	}
	require.ElementsMatch(t, []string{"deep", "small"}, topics, "the first page holds both topics")
	require.Len(t, firstBatches[0].Messages, 50, "each of two topics gets half the page")
}

// Topics an operator trips are left out until reset.
func TestOperatorTripLeavesTheTopicOut(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 3)...)
	writeMessages(t, tbl, topicMessages("B", 3)...)
	prod := memory.New(memory.Config{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	s.TopicBreaker().Trip("A", "downstream migration")
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched)
	require.Equal(t, 3, dbtest.Outstanding(t, tbl))
	st := s.TopicBreaker().Tripped()
	require.Len(t, st, 1)
	require.Equal(t, "downstream migration", st[0].LastError)
	s.TopicBreaker().Reset("A")
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched)
}

// A trip holds from the moment it is made, not from the sweep's next plan: an
// operator who trips a topic while a sweep sends it (a drain pages on past its
// tick) stops its next batch, in the page being sent and in the pages after;
// its rows stay outstanding, none charged an attempt, and once it is reset
// they go, each once and in order. The other topic is not held. The same
// with the breaker shared through Redis, whose trip count is this instance's.
func TestATripDuringASweepStopsTheTopicsNextBatch(t *testing.T) {
	t.Parallel()
	breakers := map[string]func(t *testing.T) breaker.Breaker{
		"memory": func(*testing.T) breaker.Breaker { return breaker.New(breaker.Settings{}) },
		"redis": func(t *testing.T) breaker.Breaker {
			b, err := breaker.NewRedis(breaker.RedisConfig{Client: brokertest.RedisClient(t, brokertest.RedisURL(t)),
				Prefix: brokertest.Name("outbox-sweeper-test"), OpTimeout: patience})
			require.NoError(t, err)
			return b
		},
	}
	for name, newBreaker := range breakers {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			var msgs []outbox.Message
			for i := range 100 { // A and B interleaved, so that every page holds both
				msgs = append(msgs, topicMessages("A", 100)[i], topicMessages("B", 100)[i])
			}
			writeMessages(t, tbl, msgs...)
			prod := memory.New(memory.Config{MaxBatch: 10})
			b := newBreaker(t)
			var trip sync.Once
			prod.SetSendFunc(func(_ context.Context, batch producer.Batch) error {
				if batch.Topic == "A" {
					// Before the first batch of A returns: the sweep has
					// its plan, and A's rows in its page.
					trip.Do(func() { b.Trip("A", "downstream migration") })
				}
				return nil
			})
			s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b, PageSize: 40})
			res, err := s.Sweep(context.Background())
			require.NoError(t, err)
			require.Equal(t, 10, countTopic(prod.Messages(), "A"), "A's batches after its trip were sent")
			require.Equal(t, 100, countTopic(prod.Messages(), "B"), "B was held with A")
			require.Equal(t, 110, res.Dispatched)
			require.Empty(t, res.FailedTopics)
			require.Equal(t, 90, dbtest.Outstanding(t, tbl))
			var charged int
			require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(),
				"SELECT count(*) FROM "+tbl.Ident()+" WHERE attempts > 0").Scan(&charged))
			require.Zero(t, charged, "rows of a topic tripped mid-sweep were charged an attempt")

			b.Reset("A")
			_, err = s.Sweep(context.Background())
			require.NoError(t, err)
			var sent []string
			for _, m := range prod.Messages() {
				if m.Topic == "A" {
					sent = append(sent, string(m.Payload))
				}
			}
			want := make([]string, 100)
			for i := range want {
				want[i] = fmt.Sprintf("A-%d", i)
			}
			require.Equal(t, want, sent, "A's rows, each once and in order")
			require.Zero(t, dbtest.Outstanding(t, tbl))
		})
	}
}

// Behind, how far the sweeps are behind the commits, is the age of the oldest
// row of the last page claimed: kept after a sweep whose batches failed (its
// rows wait for the next sweeps) and 0 after one that left nothing to send.
func TestBehindIsKeptWhileBatchesFail(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 3)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("A", errors.New("broker busy")) // transient: no trip at the first failure
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 100})})
	require.Zero(t, s.Behind(time.Now()), "before any sweep")
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Positive(t, res.FailedBatches)
	require.Positive(t, s.Behind(time.Now()), "a sweep whose batch failed")

	prod.HealTopic("A")
	for dbtest.Outstanding(t, tbl) > 0 { // the topic's backoff may leave it out of a sweep
		_, err = s.Sweep(context.Background())
		require.NoError(t, err)
	}
	require.Zero(t, s.Behind(time.Now()), "nothing left to send")
}

// The sweeps that leave a failed topic out while it backs off keep Behind,
// and it grows: the topic's rows still wait (it read 0 at such a sweep
// before, and a topic failing at every retry, with sweeps in between, looked
// as good as drained between two of them).
func TestBehindGrowsWhileAFailedTopicBacksOff(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 3)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("A", errors.New("broker busy"))
	// A backoff of half an hour at least: the second sweep surely leaves A out.
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 100}),
		Retry:        breaker.Retry{Attempts: 1, Initial: time.Hour, Max: time.Hour}, TopicBackoffMax: time.Hour})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Positive(t, res.FailedBatches)
	first := s.Behind(time.Now())
	require.Positive(t, first, "a sweep whose batch failed")

	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.Batches, "A backs off: nothing sent, nothing failed")
	require.Len(t, s.TopicBackoffs(), 1)
	require.GreaterOrEqual(t, s.Behind(time.Now()), first, "A's rows wait out its backoff")
	require.Equal(t, 3, dbtest.Outstanding(t, tbl))
}

// topicCounter counts the batches of topic a memory producer was asked to send,
// failed or not.
type topicCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *topicCounter) hook(_ context.Context, b producer.Batch) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[b.Topic]++
	return nil
}

func (c *topicCounter) get(topic string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[topic]
}

// Two sweeper instances share their topic breaker through Redis: a trip on one
// leaves the topic out on the other at its next tick; the cooldown is counted
// once; exactly one instance sends the half-open trial.
func TestTwoSweepersShareTheTopicBreakerThroughRedis(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 40)...)
	writeMessages(t, tbl, topicMessages("B", 40)...)

	client := brokertest.RedisClient(t, brokertest.RedisURL(t))
	prefix := brokertest.Name("outbox-sweeper-test")

	calls := &topicCounter{n: map[string]int{}}
	newInstance := func(name string) (*outbox.Sweeper, *memory.Producer) {
		// Redis is up throughout: a slow answer must not be taken for an
		// outage, which would leave each instance on its own state.
		b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: prefix, Instance: name,
			Settings: breaker.Settings{CooldownTicks: 2}, OpTimeout: patience})
		require.NoError(t, err)
		p := memory.New(memory.Config{MaxBatch: 10})
		p.SetSendFunc(calls.hook)
		p.FailTopic("A", producer.NewTopicError("not_found", errors.New("A is gone")))
		return newSweeper(t, dbtest.NewPool(t, 6), p, outbox.Config{Table: tbl, TopicBreaker: b, PageSize: 20}), p
	}
	one, p1 := newInstance("one")
	two, p2 := newInstance("two")
	sweep := func(s *outbox.Sweeper) {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
	}

	sweep(one) // one: A fails and trips in Redis (first tick: one holds the lease)
	require.Equal(t, 1, calls.get("A"))
	sweep(two) // two: A is left out
	require.Equal(t, 1, calls.get("A"), "the trip on one leaves A out on two")
	require.Equal(t, breaker.StateTripped, two.TopicBreaker().State("A"))

	// Both tick; only one (the lease holder) counts. Cooldown 2: A is left out
	// of one's next two ticks, and tried in its third.
	for range 2 {
		sweep(two)
		sweep(one)
	}
	sweep(two)
	require.Equal(t, breaker.StateTripped, two.TopicBreaker().State("A"), "five ticks, two counted")
	require.Equal(t, 1, calls.get("A"))

	// one's tick makes A half-open, and both instances plan at once. A is still
	// down, so the trial fails and trips A again: had both sent a trial, A would
	// have seen two more batches.
	var wg sync.WaitGroup
	wg.Go(func() { sweep(one) })
	wg.Go(func() { sweep(two) })
	wg.Wait()
	require.Equal(t, 2, calls.get("A"), "exactly one trial batch, by one instance")
	require.Equal(t, breaker.StateTripped, one.TopicBreaker().State("A"), "the trial failed")

	p1.HealTopic("A")
	p2.HealTopic("A")
	for i := 0; dbtest.Outstanding(t, tbl) > 0; i++ {
		require.Less(t, i, 20, "A never closed")
		sweep(one)
		sweep(two)
	}
	require.Equal(t, breaker.StateClosed, two.TopicBreaker().State("A"), "a later trial succeeded; the rest of A went")
}

// Redis stops in the middle of a run: healthy topics keep being dispatched, a
// topic that fails meanwhile is tripped on local state, and once Redis is back
// the shared state holds that trip.
func TestRedisOutageDoesNotStopRelaying(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	url, stop, start := brokertest.StartRedis(t)
	client := brokertest.RedisClient(t, url)
	// Redis is stopped, not hung, so calls fail at once while it is down: the
	// op timeout only has to outlast a busy machine while it is up.
	b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: "outage", OpTimeout: patience})
	require.NoError(t, err)
	prod := memory.New(memory.Config{})
	prod.FailTopic("A", producer.NewTopicError("not_found", errors.New("A is down")))
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b})

	writeMessages(t, tbl, topicMessages("B", 5)...)
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 5, res.Dispatched)

	stop()
	writeMessages(t, tbl, topicMessages("A", 5)...)
	writeMessages(t, tbl, topicMessages("B", 5)...)
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 5, res.Dispatched, "B goes on while Redis is down")
	require.Equal(t, []string{"A"}, res.FailedTopics)
	require.True(t, b.Degraded())
	require.Equal(t, breaker.StateTripped, b.State("A"), "tripped on local state")

	start()
	dbtest.Eventually(t, patience, "the breaker back on Redis", func() bool {
		_, err := s.Sweep(context.Background()) // its tick asks Redis again
		require.NoError(t, err)
		return !b.Degraded()
	})
	shared, err := client.HKeys(context.Background(), "outage:topics").Result()
	require.NoError(t, err)
	require.Equal(t, []string{"A"}, shared, "the local trip is shared once Redis is back")
	require.Equal(t, 5, dbtest.Outstanding(t, tbl), "A's rows wait, none lost")
}

// More topics than a page holds: each page reads at most PageSize topics, one
// row each, and the others take their turn, so the page size still bounds what
// one page holds.
func TestMoreTopicsThanThePageHolds(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	var msgs []outbox.Message
	for i := range 30 {
		msgs = append(msgs, topicMessages(fmt.Sprintf("t%02d", i), 2)...)
	}
	writeMessages(t, tbl, msgs...)
	prod := memory.New(memory.Config{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 10})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 60, res.Dispatched)
	require.GreaterOrEqual(t, res.Pages, 6, "60 rows, at most 10 a page")
	for _, b := range prod.Accepted() {
		require.Len(t, b.Messages, 1, "a share of one row per topic")
	}
}

// A half-open topic whose first batch is all poison (message-class) tries the
// next batch: poison says nothing of the topic, and must not hold its trial.
func TestTrialGoesPastPoison(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 6)...)
	prod := memory.New(memory.Config{MaxBatch: 2})
	for id := int64(1); id <= 2; id++ {
		prod.FailMessage(id, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("413")))
	}
	b := breaker.New(breaker.Settings{CooldownTicks: 1})
	b.Trip("A", "test")
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b})
	sweep := sweeps(t, s)
	require.Zero(t, sweep().Batches, "cooling down")
	res := sweep() // half-open: batch 1 is poison, batch 2 is the trial
	require.Equal(t, 2, res.Dispatched)
	require.Equal(t, breaker.StateClosed, b.State("A"))
	require.Equal(t, 2, sweep().Dispatched, "closed: the last batch goes")
}

// The broker is down: the dependency breaker opens after its failed sends, the
// ticks while it is open read nothing and call nothing (and raise no attempts),
// one trial goes through after the open duration, and once the broker is back
// every row is delivered.
func TestDependencyBreakerThroughTheSweeper(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	for _, topic := range []string{"a", "b", "c"} {
		writeMessages(t, tbl, topicMessages(topic, 4)...)
	}
	prod := memory.New(memory.Config{})
	for _, topic := range []string{"a", "b", "c"} {
		prod.FailTopic(topic, refused)
	}
	guarded := brokerBreaker(t, breaker.DependencyConfig{Failures: 2, OpenDuration: openWindow})
	// A high topic threshold keeps the topic breaker out of this test.
	topics := breaker.New(breaker.Settings{FailureThreshold: 1000})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: topics, Concurrency: 1,
		BrokerBreaker: guarded, Retry: once, TopicBackoffMax: -1})
	sweep := sweeps(t, s)

	sweep()
	require.Equal(t, breaker.DependencyOpen, guarded.State())
	require.Equal(t, 2, prod.Calls(), "opened after exactly two failed sends")
	attempted := 0
	for _, r := range readRows(t, tbl) {
		attempted += r.Attempts
	}
	require.Zero(t, attempted, "a broker that is down is never the rows' fault")

	behind := s.Behind(time.Now())
	require.Positive(t, behind, "the failed sends' rows wait")
	res := sweep()
	require.True(t, res.Blocked)
	require.Zero(t, res.Pages, "no page read while open")
	require.GreaterOrEqual(t, s.Behind(time.Now()), behind, "the rows wait while the broker is down")
	require.Equal(t, 2, prod.Calls(), "no call while open")
	require.Equal(t, breaker.DependencyOpen, guarded.State(), "fail fast: the sweep returned without waiting for the breaker")

	for _, topic := range []string{"a", "b", "c"} {
		prod.HealTopic(topic)
	}
	dbtest.Eventually(t, openWindow+patience, "the breaker half-open", func() bool { return guarded.State() == breaker.DependencyHalfOpen })
	// Half-open: the first batch is the trial (concurrent ones would be refused:
	// see breaker's TestDependencyBreakerOpensFailsFastAndRecovers); it succeeds,
	// the breaker closes, and the other topics follow in the same tick.
	res = sweep()
	require.Equal(t, breaker.DependencyClosed, guarded.State())
	require.Equal(t, 5, prod.Calls(), "the trial, then the two other topics")
	require.Equal(t, 12, res.Dispatched)
	require.Zero(t, dbtest.Outstanding(t, tbl), "every row delivered once the broker is back")
	require.Zero(t, s.Behind(time.Now()), "nothing waits")
}

// In a relay of many, the broker breaker is the relay's: while another
// outbox's half-open trial is out, this one's sends are refused, and its
// sweep ends with no failure of its own. Its rows still wait: Behind is kept
// (it was reset, and a broker down for longer than an alert's five minutes
// read as no lag), and reset once they are sent.
func TestBehindIsKeptWhileAnotherOutboxsTrialIsOut(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("a", 3)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("a", refused)
	guarded := brokerBreaker(t, breaker.DependencyConfig{Failures: 1, OpenDuration: openWindow})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000}),
		Concurrency: 1, BrokerBreaker: guarded, Retry: once, TopicBackoffMax: -1})
	sweep := sweeps(t, s)
	sweep()
	require.Equal(t, breaker.DependencyOpen, guarded.State())
	require.Positive(t, s.Behind(time.Now()))

	prod.HealTopic("a")
	dbtest.Eventually(t, openWindow+patience, "the breaker half-open", func() bool { return guarded.State() == breaker.DependencyHalfOpen })
	trial, err := guarded.Allow() // another outbox's
	require.NoError(t, err)
	res := sweep()
	require.Zero(t, res.FailedBatches, "refused, not failed")
	require.Zero(t, res.Dispatched)
	require.False(t, res.Blocked, "half-open: the sweep read its page")
	require.Positive(t, s.Behind(time.Now()), "the rows wait for the other outbox's trial")

	trial(breaker.BrokerUp, nil)
	require.Equal(t, breaker.DependencyClosed, guarded.State())
	require.Equal(t, 3, sweep().Dispatched)
	require.Zero(t, s.Behind(time.Now()), "nothing waits")
}

// The broker is down for every topic: with the topic breaker at its defaults
// (threshold 1), the failures are the broker's, not the topics': no topic trips,
// the dependency breaker opens, and once the broker is back nothing waits out a
// topic cooldown.
func TestBrokerOutageDoesNotTripTheTopics(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	for _, topic := range []string{"a", "b", "c"} {
		writeMessages(t, tbl, topicMessages(topic, 2)...)
	}
	prod := memory.New(memory.Config{})
	for _, topic := range []string{"a", "b", "c"} {
		prod.FailTopic(topic, refused)
	}
	guarded := brokerBreaker(t, breaker.DependencyConfig{Failures: 3, OpenDuration: openWindow})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, BrokerBreaker: guarded, Retry: once})
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, breaker.DependencyOpen, guarded.State())
	require.Empty(t, s.TopicBreaker().Tripped(), "the outage is the broker's")

	for _, topic := range []string{"a", "b", "c"} { // the broker is back
		prod.HealTopic(topic)
	}
	// The topics wait out their backoff (a few hundred ms) and the breaker its
	// open duration; then everything goes.
	dbtest.Eventually(t, openWindow+patience, "every row delivered", func() bool {
		_, err = s.Sweep(context.Background())
		require.NoError(t, err)
		return dbtest.Outstanding(t, tbl) == 0
	})
	require.Empty(t, s.TopicBreaker().Tripped())
}

// While the broker breaker is half-open it lets one send through and refuses
// the others. The sweep sends one batch alone first: if the broker is still
// down, that is the only send and no other batch is claimed only to be
// refused; once it succeeds, the sweep goes on with every topic.
func TestHalfOpenBrokerBreakerGetsOneBatchAlone(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	for _, topic := range []string{"a", "b", "c", "d"} {
		writeMessages(t, tbl, topicMessages(topic, 3)...)
	}
	prod := memory.New(memory.Config{})
	down := refused
	guarded := brokerBreaker(t, breaker.DependencyConfig{Failures: 1, OpenDuration: openWindow})
	// Sends take a while, so that concurrent ones would meet the half-open
	// breaker. A slow machine only makes that likelier; were a send not held,
	// a sweep that did send concurrently could slip through unnoticed, never
	// fail one that sends the trial alone.
	prod.SetSendFunc(func(ctx context.Context, b producer.Batch) error {
		time.Sleep(30 * time.Millisecond)
		return nil
	})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Concurrency: 4, BrokerBreaker: guarded, Retry: once,
		TopicBackoffMax: -1, TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	// The outage: a failed send opens the breaker.
	failBroker(t, guarded, 1)
	require.Equal(t, breaker.DependencyOpen, guarded.State())

	// Still down when the breaker turns half-open: one send, nothing refused.
	prod.FailNextCalls(1, down)
	dbtest.Eventually(t, openWindow+patience, "the breaker half-open", func() bool { return guarded.State() == breaker.DependencyHalfOpen })
	calls := prod.Calls()
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, calls+1, prod.Calls(), "one trial send")
	require.Equal(t, 12, dbtest.Outstanding(t, tbl))
	require.Equal(t, 1, res.Batches, "no batch claimed only to be refused")
	require.Equal(t, breaker.DependencyOpen, guarded.State())
	for _, r := range readRows(t, tbl) {
		require.Zero(t, r.Attempts, "a failed trial is the broker's, not the rows': row %d", r.ID)
	}

	// Back: the trial closes the breaker and the same sweep sends the rest.
	dbtest.Eventually(t, openWindow+patience, "the breaker half-open", func() bool { return guarded.State() == breaker.DependencyHalfOpen })
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, res.FailedBatches, "no send refused by the half-open breaker")
	require.Equal(t, breaker.DependencyClosed, guarded.State())
	require.Equal(t, 12, res.Dispatched)
	require.Zero(t, dbtest.Outstanding(t, tbl))
}

// Under a host's page limit (a fleet's drain while quiet tenants sweep) the
// half-open broker breaker's trial is a page of that limit too; the tried
// topic sits out the rest of that sweep (it had its batch), and the next
// sends the rest, in order, in pages of the limit.
func TestHalfOpenTrialKeepsToTheHostsPageLimit(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("a", 10)...)
	prod := memory.New(memory.Config{})
	var mu sync.Mutex
	var sent [][]int64
	prod.SetSendFunc(func(_ context.Context, b producer.Batch) error {
		mu.Lock()
		defer mu.Unlock()
		sent = append(sent, b.IDs())
		return nil
	})
	guarded := brokerBreaker(t, breaker.DependencyConfig{Failures: 1, OpenDuration: openWindow})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, PageSize: 500, Host: pagingHost{limit: 3},
		BrokerBreaker: guarded, Retry: once})
	failBroker(t, guarded, 1)
	dbtest.Eventually(t, openWindow+patience, "the breaker half-open", func() bool { return guarded.State() == breaker.DependencyHalfOpen })

	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, breaker.DependencyClosed, guarded.State(), "the trial closed the breaker")
	require.Equal(t, 3, res.Dispatched, "the trial's page alone")
	res, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 7, res.Dispatched)
	require.Zero(t, dbtest.Outstanding(t, tbl))
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, sent)
	require.Len(t, sent[0], 3, "the trial's page keeps to the limit")
	var ids []int64
	for _, b := range sent {
		require.LessOrEqual(t, len(b), 3, "a page over the limit: %v", sent)
		ids = append(ids, b...)
	}
	require.True(t, slices.IsSorted(ids), "sent out of order: %v", sent)
	require.Len(t, ids, 10)
}

// unreachableBatches cannot cut batches of some topics, as a producer that
// needs its broker for that (Service Bus) fails while the broker is down.
type unreachableBatches struct {
	*memory.Producer
	down map[string]bool
}

func (u unreachableBatches) Batches(ctx context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	if u.down[topic] {
		return nil, refused
	}
	return u.Producer.Batches(ctx, topic, msgs)
}

// A producer that cannot cut batches sends nothing, so the rows keep their
// attempts however many sweeps it lasts (counted, --max-attempts sweeps would
// dead-letter them), the other topics go on, and the broker breaker counts the
// failures and opens.
func TestFailureToCutBatchesCountsNoAttemptAndOpensTheBrokerBreaker(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, append(topicMessages("down", 5), topicMessages("up", 5)...)...)
	prod := unreachableBatches{Producer: memory.New(memory.Config{}), down: map[string]bool{"down": true}}
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 2, TopicBackoffMax: -1,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	for range 5 {
		res, err := s.Sweep(context.Background())
		require.NoError(t, err)
		require.Equal(t, []string{"down"}, res.FailedTopics)
	}
	require.Len(t, prod.Messages(), 5, "the other topic went on")
	for _, r := range readRows(t, tbl) {
		require.Zero(t, r.Attempts, "row %d", r.ID)
	}
	require.Equal(t, 5, dbtest.Outstanding(t, tbl), "nothing dead-lettered")

	guarded := brokerBreaker(t, breaker.DependencyConfig{Failures: 2, OpenDuration: time.Hour})
	s = newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Concurrency: 1, BrokerBreaker: guarded, Retry: once,
		TopicBackoffMax: -1, TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	for range 2 {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
	}
	require.Equal(t, breaker.DependencyOpen, guarded.State(), "failures to cut count as failed sends")
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.True(t, res.Blocked)
	for _, r := range readRows(t, tbl) {
		require.Zero(t, r.Attempts, "row %d", r.ID)
	}
}

// Each trial of a half-open broker breaker takes the next topic: a topic whose
// batch fails by itself, transiently, cannot be the only trial there is and
// keep the breaker from ever closing for the others.
func TestHalfOpenTrialsTakeTheTopicsInTurn(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, append(topicMessages("a", 3), topicMessages("b", 3)...)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("a", errors.New("stream quota exceeded, try later")) // a's own, transient
	guarded := brokerBreaker(t, breaker.DependencyConfig{Failures: 2, OpenDuration: 30 * time.Millisecond})
	failBroker(t, guarded, 2) // the outage
	require.Equal(t, breaker.DependencyOpen, guarded.State())

	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, BrokerBreaker: guarded, Retry: once,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	dbtest.Eventually(t, patience, "b delivered", func() bool {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
		n := 0
		for _, m := range prod.Messages() {
			if m.Topic == "b" {
				n++
			}
		}
		return n == 3
	})
}

// The topic that took the trial sits out the rest of that sweep: a topic-class
// failure (which closes the broker breaker: the broker answered) is recorded
// once, not again by the same sweep.
func TestTheTrialTopicIsNotSentAgainInTheSameSweep(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, append(topicMessages("a", 3), topicMessages("b", 3)...)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("a", producer.NewTopicError("not_found", errors.New("no such queue")))
	guarded := brokerBreaker(t, breaker.DependencyConfig{Failures: 1, OpenDuration: 30 * time.Millisecond})
	failBroker(t, guarded, 1)
	dbtest.Eventually(t, patience, "the breaker half-open", func() bool { return guarded.State() == breaker.DependencyHalfOpen })

	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, BrokerBreaker: guarded, Retry: once,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	res, err := s.Sweep(context.Background()) // the first trial takes the first topic, a
	require.NoError(t, err)
	require.Equal(t, breaker.DependencyClosed, guarded.State())
	require.Equal(t, []string{"a"}, res.FailedTopics)
	require.Equal(t, 3, res.Dispatched, "b, in the same sweep")
	for _, r := range readRows(t, tbl) {
		require.Zero(t, r.Attempts, "a topic-class failure is the topic's, not the rows': row %d", r.ID)
	}
	require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("a"))
}

// A message-class failure to cut that names no row is not the broker's: the
// sweeper cuts the halves on their own until each refused row stands alone,
// and dead-letters it with the producer's reason, so such rows never wait
// forever.
func TestMessageClassFailureToCutNamingNoRowIsPinnedOnItsRows(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("big", 2)...)
	prod := messageFailingBatches{memory.New(memory.Config{})}
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 3,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	for range 3 {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
	}
	require.Zero(t, dbtest.Outstanding(t, tbl), "each row refused alone is dead-lettered")
	dls := readDeadLetters(t, tbl)
	require.Len(t, dls, 2)
	for _, d := range dls {
		require.Equal(t, producer.ReasonMessageTooLarge, d.Reason)
	}
}

type messageFailingBatches struct{ *memory.Producer }

func (messageFailingBatches) Batches(context.Context, string, []producer.Message) ([]producer.Batch, error) {
	return nil, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("batch too large"))
}

// checkedTopics is a producer that knows, without sending, that no message
// can reach the topics in missing (as NATS knows a subject no stream
// captures); checks counts what it was asked.
type checkedTopics struct {
	*memory.Producer
	missing map[string]bool
	checks  atomic.Int64
}

func (c *checkedTopics) CheckTopic(_ context.Context, topic string) error {
	c.checks.Add(1)
	if c.missing[topic] {
		return producer.NewTopicError("no_stream", errors.New("no stream captures "+topic))
	}
	return nil
}

// A topic the producer refuses before paging (producer.TopicChecker) trips at
// once without a row of it claimed or sent: its rows keep no attempt, and the
// pages carry the topics that work. A tripped topic is not asked again until
// its trial.
func TestATopicNoMessageCanReachTripsWithoutClaimingARow(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	var msgs []outbox.Message
	missing := map[string]bool{}
	for i := range 50 {
		topic := fmt.Sprintf("bug.%d", i)
		missing[topic] = true
		msgs = append(msgs, topicMessages(topic, 2)...)
	}
	writeMessages(t, tbl, msgs...)
	writeMessages(t, tbl, topicMessages("good", 3)...)
	prod := &checkedTopics{Producer: memory.New(memory.Config{}), missing: missing}
	b := breaker.New(breaker.Settings{FailureThreshold: 5})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b, PageSize: 10})
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched)
	require.Equal(t, 1, res.Pages, "one page: the refused topics took none")
	require.Len(t, b.Tripped(), 50)
	require.Contains(t, b.Tripped()[0].LastError, "no stream captures")
	for _, m := range prod.Messages() {
		require.Equal(t, "good", m.Topic)
	}
	require.Equal(t, 100, dbtest.Outstanding(t, tbl))
	noted := 0
	for _, r := range readRows(t, tbl) {
		require.Zero(t, r.Attempts, "row %d", r.ID)
		if r.LastError != nil {
			require.Contains(t, *r.LastError, "no stream captures")
			noted++
		}
	}
	require.Equal(t, 50, noted, "each refused topic's oldest row says why it waits")
	asked := prod.checks.Load()
	_, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, prod.checks.Load()-asked, "tripped topics are left out of the listing: nothing to ask")
}

// stallingBroker is a broker that takes topic A's batches and then stops
// answering topic B's: each B send waits for A's to have gone through, then
// fails at once as busy where fast(n) says so for the n-th B send (from 1),
// else waits for its context to end. Its check says the broker does not
// answer. It counts B's sends and the checks.
func stallingBroker(fast func(n int32) bool) (prod *memory.Producer, bSends, checks *atomic.Int32) {
	prod, bSends, checks = memory.New(memory.Config{}), &atomic.Int32{}, &atomic.Int32{}
	aSent := make(chan struct{})
	var closeOnce sync.Once
	prod.SetSendFunc(func(ctx context.Context, b producer.Batch) error {
		if b.Topic == "A" {
			closeOnce.Do(func() { close(aSent) })
			return nil
		}
		n := bSends.Add(1)
		<-aSent // the sweep has seen the broker take a batch
		if fast(n) {
			return producer.NewTransientError("server_busy", errors.New("server busy"))
		}
		<-ctx.Done() // and now it answers nothing
		return fmt.Errorf("waiting for confirms of %d messages: %w", len(b.Messages), ctx.Err())
	})
	prod.SetCheck(func(context.Context) error {
		checks.Add(1)
		return producer.NewBrokerError("no_answer", errors.New("no answer to a passive declare"))
	})
	return prod, bSends, checks
}

// A broker that stops answering during a sweep, after sends of that sweep
// went through, is asked again when a send times out: its check fails, and
// the batch is released whole, no attempt charged, no split sent, and the
// broker breaker told it is down. The sweep's earlier success once stood as
// evidence that the broker was up: the batch was split, each half waited out
// the timeout again, and rows counted attempts.
func TestABrokerThatStopsAnsweringMidSweepIsCheckedNotSplit(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 1)...)
	writeMessages(t, tbl, topicMessages("B", 8)...)
	prod, bSends, checks := stallingBroker(func(int32) bool { return false })
	dep := brokerBreaker(t, breaker.DependencyConfig{Failures: 1, OpenDuration: time.Hour})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Retry: once, Concurrency: 2,
		SendTimeout: 200 * time.Millisecond, BrokerBreaker: dep})
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, int32(1), bSends.Load(), "the batch is not split")
	require.Equal(t, int32(1), checks.Load(), "the broker is checked")
	require.Equal(t, breaker.DependencyOpen, dep.State(), "the broker breaker heard it is down")
	for _, r := range readRows(t, tbl) {
		if r.Topic == "B" {
			require.False(t, r.Dispatched)
			require.Zero(t, r.Attempts, "row %d", r.ID)
		}
	}
}

// The same when the send's first try fails at once and its retry is what
// times out: the retry kept the first try's cause, which did not say the
// deadline passed, and the sweep's earlier success stood as evidence of a
// broker up, the row charged an attempt.
func TestABrokerThatStopsAnsweringOnARetryIsChecked(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 1)...)
	writeMessages(t, tbl, topicMessages("B", 1)...)
	prod, bSends, checks := stallingBroker(func(n int32) bool { return n == 1 }) // the retry stalls
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Concurrency: 2, SendTimeout: 300 * time.Millisecond,
		Retry: breaker.Retry{Attempts: 2, Initial: time.Millisecond, Max: time.Millisecond}})
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, int32(2), bSends.Load(), "the send and its retry")
	require.Equal(t, int32(1), checks.Load(), "the broker is checked")
	for _, r := range readRows(t, tbl) {
		if r.Topic == "B" {
			require.False(t, r.Dispatched)
			require.Zero(t, r.Attempts, "row %d", r.ID)
		}
	}
}

// A refused topic whose oldest row another sweeper's page holds has its next
// row noted instead, and the sweep goes on: the note once waited for that
// page's transaction, holding every topic of the sweep.
func TestNotingARefusedTopicPassesARowAnotherPageHolds(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("bug", 2)...)
	writeMessages(t, tbl, topicMessages("good", 3)...)
	pool := dbtest.Pool(t)
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var held int64
	require.NoError(t, tx.QueryRow(ctx, fmt.Sprintf("SELECT id FROM %s WHERE topic = 'bug' ORDER BY id LIMIT 1 FOR UPDATE",
		pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize())).Scan(&held))

	prod := &checkedTopics{Producer: memory.New(memory.Config{}), missing: map[string]bool{"bug": true}}
	s := newSweeper(t, pool, prod, outbox.Config{Table: tbl})
	// Bounded only so that a regression fails rather than hangs the run.
	sweepCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	res, err := s.Sweep(sweepCtx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched, "the topics that work are sent")
	for _, r := range readRows(t, tbl) {
		if r.Topic != "bug" {
			continue
		}
		if r.ID == held {
			require.Nil(t, r.LastError, "the held row is passed")
		} else {
			require.NotNil(t, r.LastError, "the next row says why the topic waits")
			require.Contains(t, *r.LastError, "no stream captures bug")
		}
	}
}

// hungBatches is a producer whose Batches waits for the broker (as Service
// Bus's does, sizing a batch on its link) and the broker never answers.
type hungBatches struct{ *memory.Producer }

func (hungBatches) Batches(ctx context.Context, _ string, _ []producer.Message) ([]producer.Batch, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// Cutting a topic's rows into batches ends by --send-timeout, as a send does,
// and a cut that gets no answer is the broker's failure: no row is charged.
func TestACutTheBrokerNeverAnswersEndsByTheSendTimeout(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 3)...)
	dep := brokerBreaker(t, breaker.DependencyConfig{Failures: 1, OpenDuration: time.Hour})
	s := newSweeper(t, dbtest.Pool(t), hungBatches{memory.New(memory.Config{})}, outbox.Config{Table: tbl, Retry: once,
		SendTimeout: 200 * time.Millisecond, BrokerBreaker: dep})
	// Bounded only so that a regression fails rather than hangs the run.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.NoError(t, ctx.Err(), "the sweep ended by the send timeout")
	require.Zero(t, res.Dispatched)
	require.Equal(t, breaker.DependencyOpen, dep.State(), "the broker's failure")
	for _, r := range readRows(t, tbl) {
		require.False(t, r.Dispatched)
		require.Zero(t, r.Attempts, "row %d", r.ID)
	}
}

// A tripped topic whose rows are gone by its trial (expired, or deleted by
// hand) closes at its trial's sweep, rather than stay half-open until a row
// comes: its alert resolves, and a closed topic is forgotten in time.
func TestAHalfOpenTopicWithNoRowsLeftCloses(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("gone", 2)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("gone", producer.NewTopicError("not_found", errors.New("no such queue")))
	var mu sync.Mutex
	var reasons []string
	b := breaker.New(breaker.Settings{CooldownTicks: 1, OnStateChange: func(_ string, _, to breaker.State, reason string) {
		mu.Lock()
		defer mu.Unlock()
		reasons = append(reasons, to.String()+": "+reason)
	}})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, TopicBreaker: b})
	sweep := sweeps(t, s)
	sweep()
	require.Equal(t, breaker.StateTripped, b.State("gone"))
	_, err := dbtest.Pool(t).Exec(context.Background(), "DELETE FROM "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+" WHERE topic = 'gone'")
	require.NoError(t, err)
	for range 4 { // the cooldown's tick, the one it turns half-open in, and its trial's
		sweep()
		if b.State("gone") == breaker.StateClosed {
			break
		}
	}
	require.Equal(t, breaker.StateClosed, b.State("gone"), "no row to try: it closes")
	require.Empty(t, prod.Messages())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "closed: no rows left to try", reasons[len(reasons)-1], "not as a trial that succeeded")
}

// uncheckable is a producer without a health check (as Service Bus's).
type uncheckable struct{ p *memory.Producer }

func (u uncheckable) Batches(ctx context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	return u.p.Batches(ctx, topic, msgs)
}
func (u uncheckable) Send(ctx context.Context, b producer.Batch) error { return u.p.Send(ctx, b) }
func (u uncheckable) Close(ctx context.Context) error                  { return u.p.Close(ctx) }

// With a producer that has no check, a timeout keeps what the sweep saw of
// the broker: a row that times out alone while other sends go through counts
// its attempt, rather than read as the broker down every time (and never be
// dead-lettered).
func TestATimeoutWithoutACheckKeepsTheSweepsEvidence(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 1)...)
	writeMessages(t, tbl, topicMessages("B", 1)...)
	mem, _, _ := stallingBroker(func(int32) bool { return false }) // its check hidden below
	s := newSweeper(t, dbtest.Pool(t), uncheckable{mem}, outbox.Config{Table: tbl, Retry: once, Concurrency: 2,
		SendTimeout: 200 * time.Millisecond, TopicBackoffMax: -1})
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	for _, r := range readRows(t, tbl) {
		if r.Topic == "B" {
			require.Equal(t, 1, r.Attempts, "the row that timed out alone counted its attempt")
		}
	}
}
