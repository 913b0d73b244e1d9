package breaker_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
)

// trialsTakeTurns trips 2*max+1 topics with cooldown 1 on b, ticks until they
// are half-open, and checks that no plan hands more than max trials, that a
// plan leaves out every half-open topic it does not try, and that every topic
// has had its trial within the first three plans. A failed trial trips the
// topic again.
func trialsTakeTurns(t *testing.T, b breaker.Breaker, max int) {
	t.Helper()
	var topics []string
	for i := range 2*max + 1 {
		topics = append(topics, fmt.Sprintf("flood.%03d", i))
	}
	for _, topic := range topics {
		b.Trip(topic, "test")
	}
	b.OnTick()
	b.OnTick()
	for _, topic := range topics {
		require.Equal(t, breaker.StateHalfOpen, b.State(topic), topic)
	}
	tried := map[string]bool{}
	for plan := range 3 {
		p := b.Plan()
		require.LessOrEqual(t, len(p.Trials), max, "plan %d", plan)
		for _, topic := range topics {
			if !p.Trials[topic] {
				require.True(t, slices.Contains(p.Excluded, topic), "plan %d neither tries nor leaves out %s", plan, topic)
			} else if !tried[topic] {
				tried[topic] = true
				b.Failure(topic, p.Gen(topic), true, "no stream")
				require.Equal(t, breaker.StateTripped, b.State(topic), "a failed trial trips %s again", topic)
			}
		}
	}
	require.Len(t, tried, len(topics), "every half-open topic tried within three plans of %d", max)
}

// Issue 30: a flood's topics, tripped together, come out of their cooldown
// together; a plan tries at most MaxTrials of them, and the rest take their
// turn in the next plans.
func TestAPlanTriesAtMostMaxTrialsTopicsAndTheRestTakeTurns(t *testing.T) {
	t.Parallel()
	b, _, _ := setup(breaker.Settings{CooldownTicks: 1, MaxTrials: 4})
	trialsTakeTurns(t, b, 4)
}

func TestRedisPlanTriesAtMostMaxTrialsTopicsAndTheRestTakeTurns(t *testing.T) {
	t.Parallel()
	one, _ := sharedPair(t, breaker.Settings{CooldownTicks: 1, MaxTrials: 4}, time.Minute)
	trialsTakeTurns(t, one, 4)
}

// The default cap leaves a handful of half-open topics alone: all are tried
// in the first plan, as before the cap.
func TestFewHalfOpenTopicsAreAllTriedAtOnce(t *testing.T) {
	t.Parallel()
	b, _, _ := setup(breaker.Settings{CooldownTicks: 1})
	for _, topic := range []string{"a", "b", "c"} {
		b.Trip(topic, "test")
	}
	b.OnTick()
	b.OnTick()
	require.Equal(t, map[string]bool{"a": true, "b": true, "c": true}, b.Plan().Trials)
}
