package breaker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

func batch(topic string, id int) producer.Batch {
	return producer.Batch{Topic: topic, Messages: producertest.Messages(topic, id, 1)}
}

// Delays double from RetryInitial up to RetryMax, each drawn in [0, that) by the
// injected random source.
func TestFullJitterGrowsExponentiallyWithinBounds(t *testing.T) {
	t.Parallel()
	for _, r := range []float64{0, 0.5, 0.999} {
		f := breaker.NewFullJitter(200*time.Millisecond, 5*time.Second, func() float64 { return r })
		ceiling := 200 * time.Millisecond
		for range 8 {
			d := f.NextBackOff()
			require.Equal(t, time.Duration(r*float64(ceiling)), d)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, max(ceiling, time.Nanosecond))
			ceiling = min(2*ceiling, 5*time.Second)
		}
		f.Reset()
		require.Equal(t, time.Duration(r*float64(200*time.Millisecond)), f.NextBackOff())
	}
}

func TestRetryStopsAtTheAttemptLimit(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailNextCalls(100, errors.New("connection reset"))
	g := breaker.Guard(p, breaker.DependencyConfig{RetryAttempts: 3, RetryInitial: time.Millisecond, RetryMax: time.Millisecond})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	err := g.Send(context.Background(), batch("t", 1))
	require.ErrorContains(t, err, "after 3 tries: connection reset")
	require.Equal(t, producer.ClassTransient, producer.ClassOf(err))
	require.Equal(t, 3, p.Calls())
}

func TestRetryStopsAtTheSendTimeout(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailNextCalls(100, errors.New("connection reset"))
	g := breaker.Guard(p, breaker.DependencyConfig{RetryAttempts: 100, RetryInitial: 40 * time.Millisecond, RetryMax: 40 * time.Millisecond,
		Rand: func() float64 { return 0.999 }})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := g.Send(ctx, batch("t", 1))
	require.ErrorContains(t, err, "connection reset", "the last failure, not just the deadline")
	require.Less(t, time.Since(start), 400*time.Millisecond, "the send's deadline ends the retries")
	require.Less(t, p.Calls(), 10)
}

// Topic- and message-class errors are not retried, and leave the breaker closed
// however many come.
func TestTopicAndMessageErrorsAreNotRetriedNorCounted(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailTopic("gone", producer.NewTopicError("not_found", errors.New("404")))
	p.FailMessage(7, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("413")))
	g := breaker.Guard(p, breaker.DependencyConfig{Failures: 2, RetryInitial: time.Millisecond})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	for range 5 {
		require.Equal(t, producer.ClassTopic, producer.ClassOf(g.Send(context.Background(), batch("gone", 1))))
		require.Equal(t, producer.ClassMessage, producer.ClassOf(g.Send(context.Background(), batch("x", 7))))
	}
	require.Equal(t, 10, p.Calls(), "one call each: no retry")
	require.Equal(t, breaker.DependencyClosed, g.State())
}

type recorder struct {
	mu      sync.Mutex
	changes []string
	alerts  []alert.Alert
}

func (r *recorder) change(from, to breaker.DependencyState, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, from.String()+"→"+to.String()+": "+reason)
}

func (r *recorder) Alert(_ context.Context, a alert.Alert) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.alerts = append(r.alerts, a)
	return nil
}

func (r *recorder) snapshot() ([]string, []alert.Alert) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.changes...), append([]alert.Alert(nil), r.alerts...)
}

// The breaker opens after exactly Failures failed sends; while open the
// producer sees no call; after OpenDuration exactly one trial goes through; a
// successful trial closes it. Every change is observed and alerted once.
func TestDependencyBreakerOpensFailsFastAndRecovers(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailTopic("t", errors.New("dial tcp: connection refused"))
	rec := &recorder{}
	g := breaker.Guard(p, breaker.DependencyConfig{Failures: 3, OpenDuration: 500 * time.Millisecond, RetryAttempts: 1,
		OnStateChange: rec.change, Alerter: rec})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	ctx := context.Background()

	for i := range 3 {
		require.Equal(t, producer.ClassTransient, producer.ClassOf(g.Send(ctx, batch("t", i))))
		require.Equal(t, i < 2, !g.Blocked(), "after send %d", i+1)
	}
	require.Equal(t, breaker.DependencyOpen, g.State())
	require.Equal(t, 3, p.Calls())

	for range 100 { // how fast they are is BenchmarkBlockedTick's to say
		err := g.Send(ctx, batch("t", 9))
		require.Equal(t, producer.ClassLocal, producer.ClassOf(err), "refused at once: nothing was sent")
	}
	require.Equal(t, 3, p.Calls(), "no call reaches the producer while open")

	require.Eventually(t, func() bool { return g.State() == breaker.DependencyHalfOpen }, 5*time.Second, 10*time.Millisecond)
	// Two sends at once in half-open: the trial is held in the producer until
	// the other send has come back refused.
	p.HealTopic("t")
	inTrial := make(chan struct{})
	release := make(chan struct{})
	p.SetSendFunc(func(context.Context, producer.Batch) error { close(inTrial); <-release; return nil })
	trial := make(chan error, 1)
	go func() { trial <- g.Send(ctx, batch("t", 20)) }()
	<-inTrial
	err := g.Send(ctx, batch("t", 21))
	require.Equal(t, producer.ClassLocal, producer.ClassOf(err), "half-open lets one trial through; the other is refused")
	close(release)
	require.NoError(t, <-trial)
	require.Equal(t, breaker.DependencyClosed, g.State(), "the trial succeeded")
	require.Len(t, p.Messages(), 1, "one trial batch reached the producer")
}

func TestDependencyTrialSuccessClosesAndIsObserved(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailNextCalls(2, errors.New("connection refused"))
	rec := &recorder{}
	g := breaker.Guard(p, breaker.DependencyConfig{Failures: 2, OpenDuration: 100 * time.Millisecond, RetryAttempts: 1,
		OnStateChange: rec.change, Alerter: rec})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	ctx := context.Background()
	_ = g.Send(ctx, batch("t", 1))
	_ = g.Send(ctx, batch("t", 2))
	require.True(t, g.Blocked())
	time.Sleep(150 * time.Millisecond)
	require.False(t, g.Blocked(), "half-open: the sweeper pages again")
	require.NoError(t, g.Send(ctx, batch("t", 3)))
	require.Equal(t, breaker.DependencyClosed, g.State())
	require.Eventually(t, func() bool { c, a := rec.snapshot(); return len(c) == 3 && len(a) == 3 }, 5*time.Second, 10*time.Millisecond)
	changes, alerts := rec.snapshot()
	require.Contains(t, changes[0], "closed→open: 2 sends in a row failed (last: ")
	require.Contains(t, changes[0], "connection refused")
	require.Contains(t, changes[1], "open→half-open")
	require.Equal(t, "half-open→closed: the trial batch succeeded", changes[2])
	require.Len(t, alerts, 3)
	require.Equal(t, "critical", alerts[0].Severity)
	require.Equal(t, "dependency-breaker", alerts[0].Component)
	require.Equal(t, "info", alerts[2].Severity)
}

func TestCancelledSendsDoNotCount(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	g := breaker.Guard(p, breaker.DependencyConfig{Failures: 1})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 3 {
		require.Equal(t, producer.ClassLocal, producer.ClassOf(g.Send(ctx, batch("t", 1))))
	}
	require.Equal(t, breaker.DependencyClosed, g.State())
}

// The reason of a change names the failure that caused it: the send that opened
// the breaker, and the trial's own error when a trial fails.
func TestChangeReasonsNameTheirOwnFailure(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailNextCalls(1, errors.New("first: connection refused"))
	rec := &recorder{}
	g := breaker.Guard(p, breaker.DependencyConfig{Failures: 1, OpenDuration: 100 * time.Millisecond, RetryAttempts: 1,
		OnStateChange: rec.change})
	t.Cleanup(func() { _ = g.Close(context.Background()) })
	_ = g.Send(context.Background(), batch("t", 1))
	require.Eventually(t, func() bool { return g.State() == breaker.DependencyHalfOpen }, 5*time.Second, 10*time.Millisecond)
	p.FailNextCalls(1, errors.New("second: broker shutting down"))
	_ = g.Send(context.Background(), batch("t", 2))
	require.Eventually(t, func() bool { c, _ := rec.snapshot(); return len(c) == 3 }, 5*time.Second, 10*time.Millisecond)
	changes, _ := rec.snapshot()
	require.Contains(t, changes[0], "closed→open: 1 sends in a row failed (last: first: connection refused)")
	require.Contains(t, changes[2], "half-open→open: the trial batch failed (second: broker shutting down)")
}

func TestCloseIsIdempotentAndDeliversPendingChanges(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailNextCalls(1, errors.New("down"))
	rec := &recorder{}
	g := breaker.Guard(p, breaker.DependencyConfig{Failures: 1, RetryAttempts: 1, OnStateChange: rec.change})
	_ = g.Send(context.Background(), batch("t", 1))
	require.NoError(t, g.Close(context.Background()))
	require.NoError(t, g.Close(context.Background()))
	changes, _ := rec.snapshot()
	require.Len(t, changes, 1, "the change made before Close was delivered")
}
