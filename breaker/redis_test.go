package breaker_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
)

// sharedPair returns two breakers, as two sweeper instances would have, sharing
// state under a prefix of the test's own on the test Redis.
func sharedPair(t *testing.T, s breaker.Settings, lease time.Duration) (*breaker.Redis, *breaker.Redis) {
	t.Helper()
	opts, err := redis.ParseURL(brokertest.RedisURL(t))
	require.NoError(t, err)
	client := redis.NewClient(opts)
	prefix := brokertest.Name("outbox-breaker-test")
	t.Cleanup(func() {
		keys, _ := client.Keys(context.Background(), prefix+":*").Result()
		if len(keys) > 0 {
			client.Del(context.Background(), keys...)
		}
		_ = client.Close()
	})
	mk := func(instance string) *breaker.Redis {
		b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: prefix, Instance: instance, Settings: s, Lease: lease})
		require.NoError(t, err)
		return b
	}
	return mk("one"), mk("two")
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
	one, two := sharedPair(t, breaker.Settings{CooldownTicks: 3}, 300*time.Millisecond)
	one.Trip("A", "test")
	for range 2 {
		one.OnTick() // holds the lease: counts
		two.OnTick() // does not
	}
	require.Equal(t, 1, two.Tripped()[0].CooldownTicksLeft, "two of three ticks counted, not four")
	require.Equal(t, breaker.StateTripped, two.State("A"))

	time.Sleep(400 * time.Millisecond) // one stops ticking; its lease runs out
	two.OnTick()
	require.Equal(t, breaker.StateHalfOpen, one.State("A"), "two took over the count")
}

func TestRedisExactlyOneInstanceGetsTheTrial(t *testing.T) {
	t.Parallel()
	one, two := sharedPair(t, breaker.Settings{CooldownTicks: 1}, time.Minute)
	one.Trip("A", "test")
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
	one.OnTick()
	one.OnTick()
	p := one.Plan()
	require.True(t, p.Trials["A"])
	one.Failure("A", p.Gen("A"), false, "still down")
	st := one.Tripped()[0]
	require.Equal(t, 4, st.CooldownTicksLeft)
	require.Equal(t, 2, st.Trips)
}

// Redis stops: the breaker works on local state, says so once, and when Redis
// is back (empty, as a restarted Redis without persistence is) it copies the
// topics tripped meanwhile there.
func TestRedisOutageFallsBackAndReconciles(t *testing.T) {
	t.Parallel()
	url, stop, start := brokertest.StartRedis(t)
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	var mu sync.Mutex
	var events []error
	b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: "outage", Instance: "one",
		OpTimeout: 200 * time.Millisecond, OnRedisError: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, err)
		}})
	require.NoError(t, err)

	b.Trip("before", "tripped while Redis was up")
	stop()
	p := b.Plan() // fails over to local state
	require.True(t, b.Degraded())
	require.Contains(t, p.Excluded, "before", "the local shadow knew")
	b.Failure("during", p.Gen("during"), false, "broker down")
	b.OnTick() // Redis still down: stays local
	require.Contains(t, b.Plan().Excluded, "during")
	mu.Lock()
	require.Len(t, events, 1, "logged once")
	require.Error(t, events[0])
	mu.Unlock()

	start()
	require.Eventually(t, func() bool { b.OnTick(); return !b.Degraded() }, 10*time.Second, 50*time.Millisecond)
	mu.Lock()
	require.Nil(t, events[len(events)-1], "told that Redis is back")
	mu.Unlock()
	shared, err := client.HKeys(context.Background(), "outage:topics").Result()
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"before", "during"}, shared, "local trips copied to the new Redis")
}
