package breaker_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
)

// clock is a fake clock the tests move by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type transition struct {
	topic    string
	from, to breaker.State
}

func setup(s breaker.Settings) (*breaker.Topics, *clock, *[]transition) {
	c := &clock{now: time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)}
	var changes []transition
	var mu sync.Mutex
	s.Now = c.Now
	s.OnStateChange = func(topic string, from, to breaker.State, _ string) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, transition{topic, from, to})
	}
	return breaker.New(s), c, &changes
}

// fail reports one failed batch of topic with the generation a fresh plan gives.
func fail(b *breaker.Topics, topic string, topicClass bool) {
	b.Failure(topic, b.Plan().Gen(topic), topicClass, "boom")
}

func TestDefaultThresholdTripsOnTheFirstFailure(t *testing.T) {
	t.Parallel()
	b, _, changes := setup(breaker.Settings{})
	fail(b, "A", false)
	require.Equal(t, breaker.StateTripped, b.State("A"))
	require.Equal(t, []string{"A"}, b.Plan().Excluded)
	require.Equal(t, []transition{{"A", breaker.StateClosed, breaker.StateTripped}}, *changes)
}

func TestThresholdCountsFailuresWithinTheWindow(t *testing.T) {
	t.Parallel()
	b, clk, _ := setup(breaker.Settings{FailureThreshold: 3, FailureWindow: time.Minute})
	fail(b, "A", false)
	clk.Add(45 * time.Second)
	fail(b, "A", false)
	clk.Add(30 * time.Second) // the first failure is now outside the window
	fail(b, "A", false)
	require.Equal(t, breaker.StateClosed, b.State("A"), "only two failures within a minute")
	fail(b, "A", false)
	require.Equal(t, breaker.StateTripped, b.State("A"))
}

func TestTopicClassFailureTripsAtOnce(t *testing.T) {
	t.Parallel()
	b, _, _ := setup(breaker.Settings{FailureThreshold: 5})
	fail(b, "A", true)
	require.Equal(t, breaker.StateTripped, b.State("A"))
}

// A topic tripped with cooldown 3 is excluded for exactly 3 ticks, then
// half-open; a failing trial doubles the cooldown, a succeeding one closes it.
func TestCooldownHalfOpenAndDoubling(t *testing.T) {
	t.Parallel()
	b, _, changes := setup(breaker.Settings{CooldownTicks: 3, MaxCooldownTicks: 5})
	fail(b, "A", false)
	for tick := 1; tick <= 3; tick++ {
		b.OnTick()
		p := b.Plan()
		require.Equal(t, []string{"A"}, p.Excluded, "tick %d", tick)
		require.Empty(t, p.Trials)
		require.Equal(t, 3-tick, b.Tripped()[0].CooldownTicksLeft)
	}
	b.OnTick() // the fourth tick after the trip: the cooldown is over
	p := b.Plan()
	require.Equal(t, breaker.StateHalfOpen, b.State("A"))
	require.Equal(t, map[string]bool{"A": true}, p.Trials)
	require.Empty(t, p.Excluded)
	require.Equal(t, []string{"A"}, b.Plan().Excluded, "one trial per tick: a second plan leaves A out")

	b.Failure("A", p.Gen("A"), false, "still down")
	require.Equal(t, breaker.StateTripped, b.State("A"))
	st := b.Tripped()[0]
	require.Equal(t, 5, st.CooldownTicksLeft, "doubled from 3 to 6, capped at 5")
	require.Equal(t, 2, st.Trips)
	require.Equal(t, "still down", st.LastError)

	for range 5 {
		b.OnTick()
		require.Equal(t, []string{"A"}, b.Plan().Excluded)
	}
	b.OnTick()
	p = b.Plan()
	require.True(t, p.Trials["A"])
	b.Success("A", p.Gen("A"))
	require.Equal(t, breaker.StateClosed, b.State("A"))
	require.Empty(t, b.Tripped())
	require.Equal(t, []transition{
		{"A", breaker.StateClosed, breaker.StateTripped},
		{"A", breaker.StateTripped, breaker.StateHalfOpen},
		{"A", breaker.StateHalfOpen, breaker.StateTripped},
		{"A", breaker.StateTripped, breaker.StateHalfOpen},
		{"A", breaker.StateHalfOpen, breaker.StateClosed},
	}, *changes)

	// Closed again, its failures were forgotten: the next trip starts over at 3.
	fail(b, "A", false)
	require.Equal(t, 3, b.Tripped()[0].CooldownTicksLeft)
}

// Trips counts every trip, whatever made it (a sweep in progress reads it to
// see one made since its plan), and nothing else.
func TestTripsCountsEveryTripAndNothingElse(t *testing.T) {
	t.Parallel()
	b, _, _ := setup(breaker.Settings{CooldownTicks: 1, FailureThreshold: 2})
	require.Zero(t, b.Trips())
	fail(b, "A", false)
	require.Zero(t, b.Trips(), "one failure of two")
	fail(b, "A", false)
	require.EqualValues(t, 1, b.Trips(), "the threshold's trip")
	b.Trip("B", "by hand")
	require.EqualValues(t, 2, b.Trips(), "an operator's trip")
	b.OnTick()
	b.OnTick()
	p := b.Plan()
	require.True(t, p.Trials["A"])
	require.EqualValues(t, 2, b.Trips(), "a cooldown's end is no trip")
	b.Failure("A", p.Gen("A"), false, "still down")
	require.EqualValues(t, 3, b.Trips(), "a failed trial's trip")
	b.Reset("A")
	b.Reset("B")
	require.EqualValues(t, 3, b.Trips(), "resets are no trips")
}

func TestPerTopicCooldownOverrides(t *testing.T) {
	t.Parallel()
	b, _, _ := setup(breaker.Settings{CooldownTicks: 10, Cooldowns: map[string]int{"orders": 2}})
	fail(b, "orders", false)
	fail(b, "payments", false)
	st := b.Tripped()
	require.Equal(t, "orders", st[0].Topic)
	require.Equal(t, 2, st[0].CooldownTicksLeft)
	require.Equal(t, 10, st[1].CooldownTicksLeft)
}

// A trial handed out but never reported (its sweep stopped) is handed out again
// at the next tick.
func TestUnreportedTrialIsRetriedNextTick(t *testing.T) {
	t.Parallel()
	b, _, _ := setup(breaker.Settings{CooldownTicks: 1})
	fail(b, "A", false)
	b.OnTick()
	require.Equal(t, []string{"A"}, b.Plan().Excluded, "cooldown 1 leaves A out of one tick")
	b.OnTick()
	require.True(t, b.Plan().Trials["A"])
	b.OnTick()
	require.True(t, b.Plan().Trials["A"])
}

// An outcome reported with a generation from before a trip or reset is ignored:
// a slow batch cannot re-trip a topic an operator just reset.
func TestStaleOutcomesAreIgnored(t *testing.T) {
	t.Parallel()
	b, _, _ := setup(breaker.Settings{})
	before := b.Plan().Gen("A") // a batch of A begins
	fail(b, "A", false)         // another batch of A trips it
	b.Reset("A")
	require.Equal(t, breaker.StateClosed, b.State("A"))
	b.Failure("A", before, false, "from the batch begun before the trip")
	require.Equal(t, breaker.StateClosed, b.State("A"), "stale failure ignored")

	b.Trip("B", "maintenance")
	p := b.Plan()
	b.Reset("B")
	b.Trip("B", "again")
	b.Success("B", p.Gen("B"))
	require.Equal(t, breaker.StateTripped, b.State("B"), "stale success ignored")

	// A reset of a closed topic forgets its failures, and the batches sent
	// before it do not count after it.
	c, _, _ := setup(breaker.Settings{FailureThreshold: 2})
	before = c.Plan().Gen("C")
	fail(c, "C", false)
	c.Reset("C")
	fail(c, "C", false) // one since the reset
	c.Failure("C", before, false, "from a batch sent before the reset")
	require.Equal(t, breaker.StateClosed, c.State("C"), "one failure since the reset, not two")
}

func TestManualTripAndResetAndListing(t *testing.T) {
	t.Parallel()
	b, clk, _ := setup(breaker.Settings{})
	b.Trip("payments", "broker maintenance")
	st := b.Tripped()
	require.Len(t, st, 1)
	require.Equal(t, breaker.TopicStatus{Topic: "payments", State: "tripped", CooldownTicksLeft: 10, Trips: 1,
		TrippedAt: clk.Now(), LastError: "broker maintenance"}, st[0])
	require.Equal(t, []string{"payments"}, b.Plan().Excluded)
	b.Reset("payments")
	require.Empty(t, b.Tripped())
	require.Empty(t, b.Plan().Excluded)
	b.Reset("never-seen") // a no-op
}

// OnStateChange runs outside the lock: a hook may call back into the breaker.
func TestStateChangeHookMayCallBack(t *testing.T) {
	t.Parallel()
	var b *breaker.Topics
	var listed []breaker.TopicStatus
	b = breaker.New(breaker.Settings{OnStateChange: func(string, breaker.State, breaker.State, string) {
		listed = b.Tripped()
	}})
	b.Trip("A", "x")
	require.Len(t, listed, 1)
}

func TestStateNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "closed", breaker.StateClosed.String())
	require.Equal(t, "tripped", breaker.StateTripped.String())
	require.Equal(t, "half-open", breaker.StateHalfOpen.String())
}

// Rows that each carry a topic of their own (an application writing an id as
// the topic) leave nothing behind in the breaker once the topics are closed
// and quiet for ForgetAfter; a tripped topic is kept however long it waits.
func TestIdleClosedTopicsAreForgotten(t *testing.T) {
	t.Parallel()
	b, clk, _ := setup(breaker.Settings{FailureThreshold: 2, ForgetAfter: 5 * time.Minute})
	for i := range 2_000 {
		fail(b, fmt.Sprintf("t-%d", i), false) // one failure: stays closed
	}
	fail(b, "wrong", true)
	fail(b, "reset", true)
	staleGen := b.Plan().Gen("reset")
	b.Reset("reset")
	require.Equal(t, 2_002, breaker.Len(b))
	require.Empty(t, b.Plan().Trials)

	clk.Add(4 * time.Minute)
	b.OnTick()
	require.Equal(t, 2_002, breaker.Len(b), "within ForgetAfter, a topic's failures still count")
	clk.Add(time.Minute)
	b.OnTick()
	require.Equal(t, 1, breaker.Len(b), "only the tripped topic is left")
	require.NotEqual(t, breaker.StateClosed, b.State("wrong"))

	// A report from a batch planned before the topic was forgotten does not
	// count against the topic now.
	b.Failure("reset", staleGen, true, "late")
	require.Equal(t, breaker.StateClosed, b.State("reset"))
}
