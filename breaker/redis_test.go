package breaker_test

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
)

// patientOp bounds each Redis call of the tests' breakers against a Redis that
// is up: it only has to outlast a busy machine. (A test of the timeout itself
// sets its own.)
const patientOp = 30 * time.Second

// sharedPair returns two breakers, as two sweeper instances would have, sharing
// state under a prefix of the test's own on the test Redis.
func sharedPair(t *testing.T, s breaker.Settings, lease time.Duration) (*breaker.Redis, *breaker.Redis) {
	t.Helper()
	one, two, _, _ := sharedPairOn(t, s, lease)
	return one, two
}

// sharedPairOn is sharedPair that also returns the client and the prefix, for
// tests that look at the keys.
func sharedPairOn(t *testing.T, s breaker.Settings, lease time.Duration) (one, two *breaker.Redis, client *redis.Client, prefix string) {
	t.Helper()
	client = brokertest.RedisClient(t, brokertest.RedisURL(t))
	prefix = brokertest.RedisPrefix(t, client, "outbox-breaker-test")
	mk := func(instance string) *breaker.Redis {
		b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: prefix, Instance: instance, Settings: s, Lease: lease,
			OpTimeout: patientOp})
		require.NoError(t, err)
		return b
	}
	return mk("one"), mk("two"), client, prefix
}

func TestRedisTripIsSeenByEveryInstance(t *testing.T) {
	t.Parallel()
	one, two := sharedPair(t, breaker.Settings{}, time.Minute)
	p := two.Plan()
	one.Failure("A", one.Plan().Gen("A"), false, "connection refused")
	require.Equal(t, []string{"A"}, two.Plan().Excluded, "the other instance leaves A out at its next plan")
	require.Equal(t, breaker.StateTripped, two.State("A"))
	st := two.Tripped()
	require.Len(t, st, 1)
	require.Equal(t, "connection refused", st[0].LastError)
	require.Equal(t, 10, st[0].CooldownTicksLeft)

	// A failure reported under the plan two made before the trip is stale.
	two.Failure("A", p.Gen("A"), false, "late")
	require.Equal(t, 1, two.Tripped()[0].Trips)
}

func TestRedisFailuresOfAllInstancesCountTogether(t *testing.T) {
	t.Parallel()
	one, two := sharedPair(t, breaker.Settings{FailureThreshold: 2}, time.Minute)
	one.Failure("A", one.Plan().Gen("A"), false, "x")
	require.Equal(t, breaker.StateClosed, one.State("A"))
	two.Failure("A", two.Plan().Gen("A"), false, "y")
	require.Equal(t, breaker.StateTripped, one.State("A"))

	one.Failure("T", one.Plan().Gen("T"), true, "no such entity")
	require.Equal(t, breaker.StateTripped, two.State("T"), "topic-class trips at once")
}

// Ticks are per instance; only the lease holder counts them, so two instances
// ticking do not halve a cooldown. When the holder stops, the other takes over.
func TestRedisCooldownIsNotShortenedByMoreInstances(t *testing.T) {
	t.Parallel()
	// The lease must outlast the few calls between two of one's ticks however
	// slow the machine: the test then waits for it to run out.
	const lease = 5 * time.Second
	one, two, client, prefix := sharedPairOn(t, breaker.Settings{CooldownTicks: 3}, lease)
	one.Trip("A", "test")
	for range 2 {
		one.OnTick() // holds the lease: counts
		two.OnTick() // does not
	}
	require.Equal(t, 1, two.Tripped()[0].CooldownTicksLeft, "two of three ticks counted, not four")
	require.Equal(t, breaker.StateTripped, two.State("A"))

	// one stops ticking: wait until its lease has run out in Redis.
	require.Eventually(t, func() bool {
		n, err := client.Exists(context.Background(), prefix+":lease").Result()
		return err == nil && n == 0
	}, lease+60*time.Second, 50*time.Millisecond, "one's lease never ran out")
	two.OnTick()
	require.Equal(t, 0, one.Tripped()[0].CooldownTicksLeft, "two took over the count")
	require.Equal(t, breaker.StateTripped, one.State("A"), "left out of the third tick too")
	two.OnTick()
	require.Equal(t, breaker.StateHalfOpen, one.State("A"))
}

func TestRedisExactlyOneInstanceGetsTheTrial(t *testing.T) {
	t.Parallel()
	one, two := sharedPair(t, breaker.Settings{CooldownTicks: 1}, time.Minute)
	one.Trip("A", "test")
	one.OnTick()
	require.Equal(t, breaker.StateTripped, two.State("A"), "cooldown 1: left out of one tick")
	one.OnTick()
	require.Equal(t, breaker.StateHalfOpen, two.State("A"))

	var wg sync.WaitGroup
	plans := make([]breaker.Plan, 2)
	for i, b := range []*breaker.Redis{one, two} {
		wg.Go(func() { plans[i] = b.Plan() })
	}
	wg.Wait()
	winners := 0
	var winner *breaker.Redis
	for i, p := range plans {
		if p.Trials["A"] {
			winners++
			winner = []*breaker.Redis{one, two}[i]
		} else {
			require.Contains(t, p.Excluded, "A", "the loser leaves A out")
		}
	}
	require.Equal(t, 1, winners)

	winner.Success("A", plans[0].Gen("A"))
	require.Equal(t, breaker.StateClosed, one.State("A"))
	require.Empty(t, two.Plan().Excluded)
}

func TestRedisFailedTrialDoublesTheCooldown(t *testing.T) {
	t.Parallel()
	one, _ := sharedPair(t, breaker.Settings{CooldownTicks: 2}, time.Minute)
	one.Trip("A", "test")
	for range 3 {
		one.OnTick()
	}
	p := one.Plan()
	require.True(t, p.Trials["A"])
	one.Failure("A", p.Gen("A"), false, "still down")
	st := one.Tripped()[0]
	require.Equal(t, 4, st.CooldownTicksLeft)
	require.Equal(t, 2, st.Trips)
}

// Redis stops: the breaker works on local state, says so once, and when Redis
// is back (empty, as a restarted Redis without persistence is) it copies what it
// did meanwhile there: a trip, with its cooldown and count, and an operator's
// reset. Trips from before the outage are the restarted Redis's to forget: the
// shadow's copy of them may be stale.
func TestRedisOutageFallsBackAndReconciles(t *testing.T) {
	t.Parallel()
	url, stop, start := brokertest.StartRedis(t)
	client := brokertest.RedisClient(t, url)
	var told redisErrors
	// Redis is stopped, not hung: calls fail at once, so the op timeout only
	// has to outlast a busy machine while it is up.
	b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: "outage", Instance: "one",
		OpTimeout: patientOp, OnRedisError: told.add})
	require.NoError(t, err)

	b.Trip("before", "tripped while Redis was up")
	stop()
	p := b.Plan() // fails over to local state
	require.True(t, b.Degraded())
	require.Contains(t, p.Excluded, "before", "the local shadow knew")
	b.Failure("during", p.Gen("during"), false, "broker down")
	b.OnTick() // Redis still down: stays local, and counts the cooldown locally
	require.Contains(t, b.Plan().Excluded, "during")
	events := told.list()
	require.Len(t, events, 1, "logged once")
	require.Error(t, events[0])

	start()
	require.Eventually(t, func() bool { b.OnTick(); return !b.Degraded() }, 60*time.Second, 50*time.Millisecond)
	events = told.list()
	require.Nil(t, events[len(events)-1], "told that Redis is back")
	st := b.Tripped()
	require.Len(t, st, 1, "only the trip made during the outage is copied")
	require.Equal(t, "during", st[0].Topic)
	require.Equal(t, "tripped", st[0].State)
	left := st[0].CooldownTicksLeft
	require.True(t, left > 0 && left < 10, "cooldown 10, less the ticks counted while Redis was down: %d", left)
	require.Equal(t, 1, st[0].Trips)
	require.Equal(t, "broker down", st[0].LastError)
	var raw map[string]any
	js, err := client.HGet(context.Background(), "outage:topics", "during").Result()
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(js), &raw))
	require.Equal(t, float64(10), raw["cooldown"], "a failed trial will double the real cooldown")
}

// While Redis does not answer, the trips made on the local shadow move the
// count a sweep's gate watches (outbox: a trip holds from the next batch):
// the failures' and an operator's alike. Redis back, the copy of those
// trips to it is no new trip.
func TestRedisTripsCountWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	url, stop, start := brokertest.StartRedis(t)
	client := brokertest.RedisClient(t, url)
	b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: "trips-down", Instance: "one", OpTimeout: patientOp})
	require.NoError(t, err)
	b.Trip("up", "while Redis answers")
	up := b.Trips()
	require.Positive(t, up)

	stop()
	p := b.Plan()
	require.True(t, b.Degraded())
	b.Failure("A", p.Gen("A"), false, "broker down")
	failed := b.Trips()
	require.Greater(t, failed, up, "a failure's trip on the local shadow")
	b.Trip("B", "by hand, Redis down")
	byHand := b.Trips()
	require.Greater(t, byHand, failed, "an operator's trip on the local shadow")

	start()
	require.Eventually(t, func() bool { b.OnTick(); return !b.Degraded() }, 60*time.Second, 50*time.Millisecond)
	// The Redis started again kept nothing (no persistence): "up" is gone.
	require.ElementsMatch(t, []string{"A", "B"}, topicsOf(b.Tripped()), "the outage's trips copied")
	require.Equal(t, byHand, b.Trips(), "copying them is no trip")
	b.Reset("A")
	require.Equal(t, byHand, b.Trips(), "a reset is no trip")
}

// Forget deletes an outbox's shared state, but the generations' sequence,
// which it lets expire: a breaker made afresh on the same prefix starts with
// nothing tripped, and a topic tripped again gets a generation it never had
// (and keeps the sequence for good). With Redis down,
// it says so and what it could not delete.
func TestRedisForgetLeavesTheSequenceAlone(t *testing.T) {
	t.Parallel()
	one, two, client, prefix := sharedPairOn(t, breaker.Settings{CooldownTicks: 1}, time.Minute)
	one.Trip("A", "by hand")
	one.Trip("B", "by hand")
	one.OnTick() // the lease
	one.OnTick()
	p := two.Plan() // B's trial, after its cooldown
	require.NotEmpty(t, p.Trials)
	genBefore := p.Gen("A")
	require.NoError(t, one.Forget(context.Background()))
	keys, err := client.Keys(context.Background(), prefix+":*").Result()
	require.NoError(t, err)
	require.Equal(t, []string{prefix + ":genseq"}, keys)

	fresh, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: prefix, Instance: "fresh", OpTimeout: patientOp})
	require.NoError(t, err)
	require.Empty(t, fresh.Tripped())
	require.Empty(t, fresh.Plan().Excluded)
	ttl, err := client.PTTL(context.Background(), prefix+":genseq").Result()
	require.NoError(t, err)
	require.Positive(t, ttl, "the sequence of an outbox forgotten expires")
	fresh.Trip("A", "again")
	require.Greater(t, fresh.Plan().Gen("A"), genBefore, "a generation A never had")
	ttl, err = client.PTTL(context.Background(), prefix+":genseq").Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl, "used again, it is kept for good")

	url, stop, _ := brokertest.StartRedis(t)
	down, err := breaker.NewRedis(breaker.RedisConfig{Client: brokertest.RedisClient(t, url), Prefix: "gone", Instance: "one", OpTimeout: patientOp})
	require.NoError(t, err)
	stop()
	err = down.Forget(context.Background())
	require.ErrorContains(t, err, `forget the topic breaker's state under "gone" in Redis`)
}

func topicsOf(st []breaker.TopicStatus) []string {
	out := make([]string, 0, len(st))
	for _, s := range st {
		out = append(out, s.Topic)
	}
	return out
}

// Redis dies between the plan (read from Redis) and the failure report: the
// failure still counts, on local state, and is copied when Redis is back.
func TestRedisDyingMidTickLosesNoFailure(t *testing.T) {
	t.Parallel()
	url, stop, start := brokertest.StartRedis(t)
	b, err := breaker.NewRedis(breaker.RedisConfig{Client: brokertest.RedisClient(t, url), Prefix: "midtick",
		OpTimeout: patientOp}) // stopped, not hung: see TestRedisOutageFallsBackAndReconciles
	require.NoError(t, err)
	b.Trip("A", "x")
	b.Reset("A") // A's generation in Redis is now ahead of the shadow's
	p := b.Plan()
	stop()
	b.Failure("A", p.Gen("A"), false, "failed while Redis died")
	require.True(t, b.Degraded())
	require.Contains(t, b.Plan().Excluded, "A", "the failure counted on local state")
	start()
	require.Eventually(t, func() bool { b.OnTick(); return !b.Degraded() }, 60*time.Second, 50*time.Millisecond)
	require.Equal(t, breaker.StateTripped, b.State("A"), "and reached Redis")
}

// A Redis that hangs (stopped with SIGSTOP, so connections open but nothing
// answers) costs each call its OpTimeout, not the client's own timeouts. The
// client here waits ten minutes for an answer of its own accord, so a call that
// ignored OpTimeout would hold the test for ten minutes; the handful of calls
// below, each bounded by OpTimeout, take well under the bound asserted, however
// slow the machine.
func TestHungRedisCostsOnlyTheTimeout(t *testing.T) {
	t.Parallel()
	url, _, _ := brokertest.StartRedis(t)
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	// As brokertest.RedisClient configures it, but patient on its own.
	opts.ContextTimeoutEnabled, opts.MaxRetries = true, 1
	opts.ReadTimeout, opts.WriteTimeout = 10*time.Minute, 10*time.Minute
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: "hung", OpTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	b.OnTick()
	pid := brokertest.RedisPID(t, url)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })

	start := time.Now()
	b.OnTick()
	p := b.Plan()
	b.Failure("A", p.Gen("A"), false, "x")
	b.OnTick()
	require.Less(t, time.Since(start), 2*time.Minute, "a hung Redis must not hold the sweeper beyond OpTimeout per call")
	require.True(t, b.Degraded())
	require.Contains(t, b.Plan().Excluded, "A")
}

// A breaker on local state asks Redis again at most once per RetryEvery:
// plans within it, and TryAgain, send Redis nothing (against a hung Redis
// each call would cost OpTimeout, at every sweep of every outbox); a tick
// tries at once.
func TestRedisPlansWithinRetryEveryAskRedisNothing(t *testing.T) {
	t.Parallel()
	url, stop, _ := brokertest.StartRedis(t)
	client := brokertest.RedisClient(t, url)
	var calls atomic.Int64
	client.AddHook(countCalls{&calls})
	b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: "pace", OpTimeout: patientOp, RetryEvery: time.Hour})
	require.NoError(t, err)
	b.Trip("A", "tripped while Redis was up")
	stop()
	require.Contains(t, b.Plan().Excluded, "A", "the plan that found Redis gone, from local state")
	require.True(t, b.Degraded())
	before := calls.Load()
	for range 5 {
		require.Contains(t, b.Plan().Excluded, "A")
		require.False(t, b.TryAgain(), "tried within RetryEvery")
	}
	require.Equal(t, before, calls.Load(), "plans within RetryEvery of the last try called Redis")
	b.OnTick()
	require.Greater(t, calls.Load(), before, "a tick tries Redis at once")
}

// countCalls counts the commands and pipelines a go-redis client sends, or
// tries to.
type countCalls struct{ n *atomic.Int64 }

func (c countCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c countCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c countCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// An operator's trip or reset reports the state the topic really left, as the
// in-memory breaker does: a half-open topic tripped again is half-open→tripped.
func TestRedisOperatorChangesReportTheirRealFromState(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		changes []string
	)
	s := breaker.Settings{CooldownTicks: 1, OnStateChange: func(topic string, from, to breaker.State, _ string) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, topic+" "+from.String()+"→"+to.String())
	}}
	one, _ := sharedPair(t, s, time.Minute)
	one.Trip("A", "operator")
	for range 2 { // the cooldown of one tick is counted, then over: half-open
		one.OnTick()
	}
	require.Equal(t, breaker.StateHalfOpen, one.State("A"))
	one.Trip("A", "operator again")
	one.Reset("A")
	one.Reset("A") // closed already: no change
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"A closed→tripped", "A tripped→half-open", "A half-open→tripped", "A tripped→closed"}, changes)
}

// The generations hash, which every plan reads, holds the topics that are not
// closed: a close deletes the topic's generation. A report from a batch
// planned before a close is still ignored after the topic trips again.
func TestRedisClosedTopicsLeaveNoGeneration(t *testing.T) {
	t.Parallel()
	one, _, client, prefix := sharedPairOn(t, breaker.Settings{}, time.Minute)
	ctx := context.Background()
	for _, topic := range []string{"a", "b", "c"} {
		one.Failure(topic, one.Plan().Gen(topic), true, "no entity")
	}
	stale := one.Plan().Gen("a")
	require.NotZero(t, stale)
	require.EqualValues(t, 3, client.HLen(ctx, prefix+":gens").Val())
	for _, topic := range []string{"a", "b", "c"} {
		one.Reset(topic)
	}
	require.EqualValues(t, 0, client.HLen(ctx, prefix+":gens").Val())

	one.Failure("a", one.Plan().Gen("a"), true, "no entity again")
	require.NotEqual(t, stale, one.Plan().Gen("a"), "a generation is never handed out twice")
	one.Reset("a")
	one.Failure("a", stale, true, "late")
	require.Equal(t, breaker.StateClosed, one.State("a"))
}

// A breaker on local state tries Redis again when asked for a plan or its
// list, without a tick: an outbox that a relay of many has parked does not
// tick, and once Redis is back its next plan must see what other instances
// tripped since, and its own trip made during the outage must reach them.
// The outage's end is told once.
func TestRedisOutageEndsWithoutATick(t *testing.T) {
	t.Parallel()
	url, stop, start := brokertest.StartRedis(t)
	client := brokertest.RedisClient(t, url)
	var told redisErrors
	mk := func(instance string, onErr func(error)) *breaker.Redis {
		b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: "untickled", Instance: instance,
			OpTimeout: patientOp, RetryEvery: 20 * time.Millisecond, OnRedisError: onErr})
		require.NoError(t, err)
		return b
	}
	one := mk("one", told.add)
	two := mk("two", nil)
	stop()
	one.Trip("orders", "during the outage")
	require.True(t, one.Degraded())
	require.Equal(t, breaker.StateTripped, one.State("orders"), "tripped on local state")
	start()
	two.Trip("payments", "after the outage")
	require.Eventually(t, func() bool { return slices.Contains(one.Plan().Excluded, "payments") }, 60*time.Second, 10*time.Millisecond,
		"a plan from Redis, with no tick")
	require.False(t, one.Degraded())
	require.Equal(t, breaker.StateTripped, two.State("orders"), "the trip made during the outage reached Redis")
	one.OnTick() // a tick after the plan's try: Redis is not told back twice
	events := told.list()
	require.Len(t, events, 2, "down once, back once: %v", events)
	require.Error(t, events[0])
	require.NoError(t, events[1])
}

// redisErrors records what a breaker's OnRedisError is told, from any
// goroutine.
type redisErrors struct {
	mu     sync.Mutex
	events []error
}

func (r *redisErrors) add(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, err)
}

func (r *redisErrors) list() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// A trip another instance made (an operator's, for a downstream migration)
// holds on this one while Redis does not answer: the shadow this instance
// plans from then held only its own trips, and it sent to the topic again.
// A topic the shared state closed is closed in the shadow too.
// instances returns a maker of breakers sharing state under prefix on the
// Redis at url, one per instance name.
func instances(t *testing.T, url, prefix string) func(instance string) *breaker.Redis {
	t.Helper()
	client := brokertest.RedisClient(t, url)
	return func(instance string) *breaker.Redis {
		b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: prefix, Instance: instance, OpTimeout: patientOp})
		require.NoError(t, err)
		return b
	}
}

func TestRedisOutageKeepsTheTripsOfOtherInstances(t *testing.T) {
	t.Parallel()
	url, stop, _ := brokertest.StartRedis(t)
	mk := instances(t, url, "mirror")
	one, two := mk("one"), mk("two")
	one.Trip("stale", "tripped by one, reset by two")
	two.Reset("stale")
	two.Trip("orders", "downstream migration")
	p := one.Plan()
	require.Contains(t, p.Excluded, "orders")
	require.NotContains(t, p.Excluded, "stale")

	stop()
	p = one.Plan() // from the local shadow
	require.True(t, one.Degraded())
	require.Contains(t, p.Excluded, "orders", "the other instance's trip holds")
	require.NotContains(t, p.Excluded, "stale", "the reset made elsewhere holds too")
}

// A failure of a batch planned while the topic was closed, reported after an
// operator tripped and reset it, is stale: it must not undo the reset. Redis
// keeps no generation of a closed topic, and the close once read as the same
// generation 0 as the plan.
func TestRedisAStaleFailureDoesNotUndoAReset(t *testing.T) {
	t.Parallel()
	one, two := sharedPair(t, breaker.Settings{}, time.Minute)
	p := one.Plan() // a batch of orders begins, orders closed
	two.Trip("orders", "maintenance")
	two.Reset("orders")
	one.Failure("orders", p.Gen("orders"), true, "from the batch begun before the trip")
	require.Equal(t, breaker.StateClosed, two.State("orders"), "the reset holds")

	// A failure planned after the reset counts.
	one.Failure("orders", one.Plan().Gen("orders"), true, "no such queue")
	require.Equal(t, breaker.StateTripped, two.State("orders"))
}

// A reset of a closed topic in Redis marks it, as a close does: a failure of
// a batch planned before the reset does not count after it.
func TestRedisResetOfAClosedTopicMakesEarlierFailuresStale(t *testing.T) {
	t.Parallel()
	one, two := sharedPair(t, breaker.Settings{FailureThreshold: 2}, time.Minute)
	p := one.Plan()
	one.Failure("x", p.Gen("x"), false, "one before the reset")
	two.Reset("x")
	one.Failure("x", one.Plan().Gen("x"), false, "one since")
	one.Failure("x", p.Gen("x"), false, "from a batch planned before the reset")
	require.Equal(t, breaker.StateClosed, two.State("x"), "one failure since the reset, not two")
}

// A trip made under a plan from the local shadow, reported once Redis is back
// (the plan was made during the outage), reaches Redis.
func TestRedisATripReportedAfterTheOutageUnderAnOutagePlanReachesRedis(t *testing.T) {
	t.Parallel()
	url, stop, start := brokertest.StartRedis(t)
	mk := instances(t, url, "late")
	one := mk("one")
	stop()
	p := one.Plan() // from the shadow
	require.True(t, one.Degraded())
	start()
	require.Eventually(t, func() bool { one.OnTick(); return !one.Degraded() }, time.Minute, 50*time.Millisecond)
	one.Failure("orders", p.Gen("orders"), true, "no such queue") // the outage plan's batch fails now
	one.Plan()                                                    // tries Redis again, and copies the trip
	require.Equal(t, breaker.StateTripped, mk("two").State("orders"), "the trip is in Redis")
}
