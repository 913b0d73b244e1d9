package breaker_test

import (
	"context"
	"errors"
	"strings"
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
	r := breaker.Retry{Attempts: 3, Initial: time.Millisecond, Max: time.Millisecond}
	err := r.Do(context.Background(), func(ctx context.Context) error { return p.Send(ctx, batch("t", 1)) })
	require.ErrorContains(t, err, "after 3 tries: connection reset")
	require.Equal(t, producer.ClassTransient, producer.ClassOf(err))
	require.Equal(t, 3, p.Calls())
}

// A broker that cannot be reached is retried like a transient failure, and
// keeps its class.
func TestRetryRetriesBrokerFailures(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailNextCalls(2, producer.NewBrokerError("connection_lost", errors.New("connection refused")))
	r := breaker.Retry{Attempts: 3, Initial: time.Millisecond, Max: time.Millisecond}
	require.NoError(t, r.Do(context.Background(), func(ctx context.Context) error { return p.Send(ctx, batch("t", 1)) }))
	require.Equal(t, 3, p.Calls())
	p.FailNextCalls(5, producer.NewBrokerError("connection_lost", errors.New("connection refused")))
	err := r.Do(context.Background(), func(ctx context.Context) error { return p.Send(ctx, batch("t", 1)) })
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err))
}

func TestRetryStopsAtTheSendTimeout(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailNextCalls(100, errors.New("connection reset"))
	// Without the deadline, the attempts would take 1,000 waits of 40ms: 40s.
	r := breaker.Retry{Attempts: 1000, Initial: 40 * time.Millisecond, Max: 40 * time.Millisecond, Rand: func() float64 { return 0.999 }}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := r.Do(ctx, func(ctx context.Context) error { return p.Send(ctx, batch("t", 1)) })
	require.ErrorContains(t, err, "connection reset", "the last failure, not just the deadline")
	require.Less(t, time.Since(start), 20*time.Second, "the send's deadline ends the retries")
	// Each wait is a real 40ms, so a slow machine makes fewer calls, never more.
	require.Less(t, p.Calls(), 10)
}

// A last try cut short by the send's deadline reports the failure before it,
// not only "context deadline exceeded" (seen under a CPU hog, where the
// deadline fell during a try).
func TestADeadlineThatCutsTheLastTryKeepsTheCause(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	calls := 0
	err := breaker.Retry{Attempts: 5, Initial: time.Millisecond, Max: time.Millisecond}.Do(ctx, func(ctx context.Context) error {
		calls++
		if calls == 1 {
			return errors.New("connection reset")
		}
		<-ctx.Done() // a try that hangs until the deadline
		return ctx.Err()
	})
	require.Equal(t, 2, calls)
	require.ErrorContains(t, err, "send deadline reached after 2 tries: connection reset")
}

// Topic- and message-class errors are not retried.
func TestTopicAndMessageErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	p := memory.New(memory.Config{})
	p.FailTopic("gone", producer.NewTopicError("not_found", errors.New("404")))
	p.FailMessage(7, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("413")))
	r := breaker.Retry{Initial: time.Millisecond}
	for range 5 {
		require.Equal(t, producer.ClassTopic, producer.ClassOf(r.Do(context.Background(), func(ctx context.Context) error { return p.Send(ctx, batch("gone", 1)) })))
		require.Equal(t, producer.ClassMessage, producer.ClassOf(r.Do(context.Background(), func(ctx context.Context) error { return p.Send(ctx, batch("x", 7)) })))
	}
	require.Equal(t, 10, p.Calls(), "one call each: no retry")
}

func TestCancelledRetryIsLocal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := breaker.Retry{}.Do(ctx, func(ctx context.Context) error { return ctx.Err() })
	require.Equal(t, producer.ClassLocal, producer.ClassOf(err))
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

// send asks d, and reports v for the send it allowed.
func send(d *breaker.Dependency, v breaker.Verdict, cause error) error {
	done, err := d.Allow()
	if err != nil {
		return err
	}
	done(v, cause)
	return nil
}

var refused = errors.New("dial tcp: connection refused")

const (
	// openWindow is the open duration of breakers that a test must find still
	// open a few calls after they opened: those calls take microseconds, and
	// this leaves room for a machine thousands of times slower.
	openWindow = 3 * time.Second
	// patience bounds the waits for what must come: a breaker's change of state
	// once its time is up, the notifier's delivery.
	patience = 60 * time.Second
)

// The breaker opens after exactly Failures sends judged the broker's fault;
// while open it refuses at once with a local-class error; after OpenDuration
// exactly one trial goes through; a trial judged up closes it.
func TestDependencyBreakerOpensFailsFastAndRecovers(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	// The breaker must stay open through the hundred refusals below however
	// slow the machine; the test then waits the open duration out.
	d := breaker.NewDependency(breaker.DependencyConfig{Failures: 3, OpenDuration: openWindow,
		OnStateChange: rec.change, Alerter: rec})
	t.Cleanup(func() { _ = d.Close(context.Background()) })

	for i := range 3 {
		require.NoError(t, send(d, breaker.BrokerDown, refused))
		require.Equal(t, i < 2, d.State() == breaker.DependencyClosed, "after send %d", i+1)
	}
	require.Equal(t, breaker.DependencyOpen, d.State())
	for range 100 {
		err := send(d, breaker.BrokerUp, nil)
		require.ErrorIs(t, err, breaker.ErrBrokerOpen)
		require.Equal(t, producer.ClassLocal, producer.ClassOf(err), "refused at once: nothing was sent")
	}

	require.Eventually(t, func() bool { return d.State() == breaker.DependencyHalfOpen }, openWindow+patience, 10*time.Millisecond)
	trial, err := d.Allow()
	require.NoError(t, err)
	_, err = d.Allow()
	require.ErrorIs(t, err, breaker.ErrBrokerOpen, "half-open lets one trial through; the other is refused")
	trial(breaker.BrokerUp, nil)
	require.Equal(t, breaker.DependencyClosed, d.State(), "the trial succeeded")
}

// Verdicts of the broker up (a topic or a row refused, say) never open it, and
// reset the count of failures in a row.
func TestBrokerUpNeverOpens(t *testing.T) {
	t.Parallel()
	d := breaker.NewDependency(breaker.DependencyConfig{Failures: 2})
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	for range 10 {
		require.NoError(t, send(d, breaker.BrokerDown, refused))
		require.NoError(t, send(d, breaker.BrokerUp, nil))
	}
	require.Equal(t, breaker.DependencyClosed, d.State())
}

func TestDependencyTrialSuccessClosesAndIsObserved(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	// Open long enough that the check right after opening sees it open,
	// however slow the machine.
	d := breaker.NewDependency(breaker.DependencyConfig{Failures: 2, OpenDuration: openWindow,
		OnStateChange: rec.change, Alerter: rec})
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	require.NoError(t, send(d, breaker.BrokerDown, refused))
	require.NoError(t, send(d, breaker.BrokerDown, refused))
	require.Equal(t, breaker.DependencyOpen, d.State())
	require.Eventually(t, func() bool { return d.State() == breaker.DependencyHalfOpen }, openWindow+patience, 10*time.Millisecond)
	require.NoError(t, send(d, breaker.BrokerUp, nil))
	require.Equal(t, breaker.DependencyClosed, d.State())
	require.Eventually(t, func() bool { c, a := rec.snapshot(); return len(c) == 3 && len(a) == 3 }, patience, 10*time.Millisecond)
	changes, alerts := rec.snapshot()
	require.Contains(t, changes[0], "closed→open: 2 sends in a row failed (last: ")
	require.Contains(t, changes[0], "connection refused")
	require.Contains(t, changes[1], "open→half-open")
	require.Equal(t, "half-open→closed: the trial batch succeeded", changes[2])
	require.Len(t, alerts, 3)
	require.Equal(t, "critical", alerts[0].Severity)
	require.Equal(t, "dependency-breaker", alerts[0].Component)
	require.Equal(t, "info", alerts[2].Severity)
	for i, status := range []string{alert.Firing, alert.Firing, alert.Resolved} {
		require.Equal(t, breaker.AlertKeyBroker, alerts[i].Key)
		require.Equal(t, status, alerts[i].Status, "alert %d", i)
	}
}

// Sends that teach nothing (cancelled, nothing sent) count neither way.
func TestUnknownVerdictsDoNotCount(t *testing.T) {
	t.Parallel()
	d := breaker.NewDependency(breaker.DependencyConfig{Failures: 1})
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	for range 3 {
		require.NoError(t, send(d, breaker.VerdictUnknown, context.Canceled))
	}
	require.Equal(t, breaker.DependencyClosed, d.State())
	require.Zero(t, d.Counts().TotalFailures)
}

// The reason of a change names the failure that caused it: the send that opened
// the breaker, and the trial's own error when a trial fails.
func TestChangeReasonsNameTheirOwnFailure(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	d := breaker.NewDependency(breaker.DependencyConfig{Failures: 1, OpenDuration: 100 * time.Millisecond, OnStateChange: rec.change})
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	require.NoError(t, send(d, breaker.BrokerDown, errors.New("first: connection refused")))
	require.Eventually(t, func() bool { return d.State() == breaker.DependencyHalfOpen }, patience, 10*time.Millisecond)
	require.NoError(t, send(d, breaker.BrokerDown, errors.New("second: broker shutting down")))
	require.Eventually(t, func() bool { c, _ := rec.snapshot(); return len(c) == 3 }, patience, 10*time.Millisecond)
	changes, _ := rec.snapshot()
	require.Contains(t, changes[0], "closed→open: 1 sends in a row failed (last: first: connection refused)")
	require.Contains(t, changes[2], "half-open→open: the trial batch failed (second: broker shutting down)")
}

func TestCloseIsIdempotentAndDeliversPendingChanges(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	d := breaker.NewDependency(breaker.DependencyConfig{Failures: 1, OnStateChange: rec.change})
	require.NoError(t, send(d, breaker.BrokerDown, errors.New("down")))
	require.NoError(t, d.Close(context.Background()))
	require.NoError(t, d.Close(context.Background()))
	changes, _ := rec.snapshot()
	require.Len(t, changes, 1, "the change made before Close was delivered")
}

// An operator trips the breaker by hand: every send is refused (local class,
// nothing charged) and no trial goes through however long it stays, until
// Reset closes it with its counts at zero; a breaker that opened by itself
// resets too. Each change is observed and alerted with its reason.
func TestDependencyTrippedByHandHoldsUntilReset(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	d := breaker.NewDependency(breaker.DependencyConfig{Failures: 2, OpenDuration: time.Millisecond,
		OnStateChange: rec.change, Alerter: rec})
	t.Cleanup(func() { _ = d.Close(context.Background()) })

	d.Trip("broker maintenance")
	require.Equal(t, breaker.DependencyOpen, d.State())
	require.Equal(t, "broker maintenance", d.Tripped())
	for range 50 {
		err := send(d, breaker.BrokerUp, nil)
		require.ErrorIs(t, err, breaker.ErrBrokerOpen, "held open past its 1ms open duration")
		require.Equal(t, producer.ClassLocal, producer.ClassOf(err))
		require.Contains(t, err.Error(), "broker maintenance")
	}
	d.Reset()
	require.Equal(t, breaker.DependencyClosed, d.State())
	require.Empty(t, d.Tripped())
	require.NoError(t, send(d, breaker.BrokerUp, nil))

	// Opened by itself, reset by hand.
	require.NoError(t, send(d, breaker.BrokerDown, refused))
	require.NoError(t, send(d, breaker.BrokerDown, refused))
	require.NotEqual(t, breaker.DependencyClosed, d.State())
	d.Reset()
	require.Equal(t, breaker.DependencyClosed, d.State())
	require.Zero(t, d.Counts().ConsecutiveFailures)

	require.Eventually(t, func() bool {
		c, _ := rec.snapshot()
		return len(c) >= 4
	}, patience, 10*time.Millisecond)
	changes, alerts := rec.snapshot()
	require.Equal(t, "closed→open: tripped by an operator: broker maintenance", changes[0])
	require.Equal(t, "open→closed: reset by an operator", changes[1])
	require.Contains(t, changes[2], "closed→open: 2 sends in a row failed")
	require.Contains(t, changes[len(changes)-1], "→closed: reset by an operator")
	require.Equal(t, "warning", alerts[0].Severity, "an operator's trip alerts below an outage")
	require.Equal(t, "critical", alerts[2].Severity, "the breaker's own opening is critical")
	require.True(t, breaker.ByOperator(strings.TrimPrefix(changes[0], "closed→open: ")))
	require.False(t, breaker.ByOperator(strings.TrimPrefix(changes[2], "closed→open: ")))
}
