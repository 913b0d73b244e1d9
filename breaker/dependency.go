package breaker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/sony/gobreaker/v2"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [DependencyConfig].
const (
	BreakerFailuresDefault     = 5
	BreakerOpenDurationDefault = 30 * time.Second
	RetryAttemptsDefault       = 5
	RetryInitialDefault        = 200 * time.Millisecond
	RetryMaxDefault            = 5 * time.Second
)

// DependencyState is the dependency breaker's state, with the numbers the
// metrics export: closed 0, open 1, half-open 2.
type DependencyState int

const (
	DependencyClosed   DependencyState = 0
	DependencyOpen     DependencyState = 1
	DependencyHalfOpen DependencyState = 2
)

func (s DependencyState) String() string {
	switch s {
	case DependencyClosed:
		return "closed"
	case DependencyOpen:
		return "open"
	case DependencyHalfOpen:
		return "half-open"
	default:
		return fmt.Sprintf("dependency-state(%d)", int(s))
	}
}

// DependencyConfig configures a [Dependency]. Zero fields mean their defaults.
type DependencyConfig struct {
	// Failures is how many sends in a row the sweeper must judge the broker's
	// fault to open the breaker. A send is one batch after its retries.
	// Defaults to BreakerFailuresDefault.
	Failures int
	// OpenDuration is how long the breaker stays open before letting one trial
	// batch through. Defaults to BreakerOpenDurationDefault.
	OpenDuration time.Duration
	// OnStateChange observes every change of state (for metrics). It runs
	// outside the breaker's lock.
	OnStateChange func(from, to DependencyState, reason string)
	// Alerter receives an alert at every change of state. Optional.
	Alerter alert.Alerter
}

func (c DependencyConfig) withDefaults() DependencyConfig {
	if c.Failures <= 0 {
		c.Failures = BreakerFailuresDefault
	}
	if c.OpenDuration <= 0 {
		c.OpenDuration = BreakerOpenDurationDefault
	}
	return c
}

// Verdict is the sweeper's judgement of the broker's part in one send, which is
// all the dependency breaker counts. The breaker does not judge errors itself:
// a failed send may be the broker's fault or a row's, and only the sweeper,
// which knows what else succeeded and what the producer's health check says,
// can tell (see the outbox package's failure policy).
type Verdict int

const (
	// VerdictUnknown says nothing of the broker: the send was cancelled, or
	// nothing was sent. It counts neither way.
	VerdictUnknown Verdict = iota
	// BrokerUp: the broker answered, whatever it said of the rows or the topic.
	BrokerUp
	// BrokerDown: the broker could not be reached, or failed while it could
	// not be shown to be up.
	BrokerDown
)

func (v Verdict) String() string {
	switch v {
	case BrokerUp:
		return "up"
	case BrokerDown:
		return "down"
	default:
		return "unknown"
	}
}

// Dependency is the broker circuit breaker (sony/gobreaker's two-step breaker):
// it opens after Failures sends in a row judged [BrokerDown], refuses every send
// while open, lets one trial through after OpenDuration, and closes when the
// trial is judged [BrokerUp]. The caller asks [Dependency.Allow] before a send
// and reports its verdict after it.
//
// State changes are logged by the caller's OnStateChange and alerted; both run
// on a goroutine of their own, so a slow webhook never holds up a send.
type Dependency struct {
	cfg DependencyConfig

	mu sync.Mutex
	// cb is the breaker: replaced by a closed one on Reset. tripped holds
	// the reason an operator tripped it by hand ("" when not): it then
	// refuses every send until Reset, whatever cb says. mu is never held
	// while calling into cb (its OnStateChange takes mu under cb's lock).
	cb        *gobreaker.TwoStepCircuitBreaker[struct{}]
	tripped   string
	lastErr   string // the last failure, for the reason of a change
	changes   chan stateChange
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type stateChange struct {
	from, to DependencyState
	lastErr  string
	// manual is the reason of a change an operator made, "" for the
	// breaker's own.
	manual string
}

// Errors the verdicts become inside gobreaker, which counts errors.
var (
	errBrokerDown = errors.New("broker down")
	errNoVerdict  = errors.New("no verdict")
)

// NewDependency returns a closed breaker. Call Close to stop its notifier.
func NewDependency(cfg DependencyConfig) *Dependency {
	cfg = cfg.withDefaults()
	// Changes are few (each open lasts OpenDuration); the buffer absorbs a slow
	// alerter without blocking gobreaker, which calls us under its lock.
	d := &Dependency{cfg: cfg, changes: make(chan stateChange, 1024), done: make(chan struct{})}
	d.cb = d.newBreaker()
	d.wg.Add(1)
	go d.notifyLoop()
	return d
}

// newBreaker returns a closed gobreaker breaker that reports its changes to
// the notifier.
func (d *Dependency) newBreaker() *gobreaker.TwoStepCircuitBreaker[struct{}] {
	var cb *gobreaker.TwoStepCircuitBreaker[struct{}]
	cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         "broker",
		MaxRequests:  1,
		Timeout:      d.cfg.OpenDuration,
		ReadyToTrip:  func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= uint32(d.cfg.Failures) },
		IsSuccessful: func(err error) bool { return !errors.Is(err, errBrokerDown) },
		IsExcluded:   func(err error) bool { return errors.Is(err, errNoVerdict) },
		// gobreaker calls this under its lock: hand the change to the notifier
		// goroutine, never call back into the breaker here. A breaker Reset
		// replaced reports nothing more.
		OnStateChange: func(_ string, from, to gobreaker.State) {
			d.mu.Lock()
			last, current, held := d.lastErr, d.cb == cb, d.tripped != ""
			d.mu.Unlock()
			if current && !held {
				d.notify(stateChange{fromGobreaker(from), fromGobreaker(to), last, ""})
			}
		},
	})
	return cb
}

func (d *Dependency) notify(c stateChange) {
	select {
	case d.changes <- c:
	default: // a burst of changes beyond the buffer: the state is what counts
	}
}

// Trip opens the breaker by hand, for reason: every send is refused, and no
// trial goes through, until Reset. For a broker an operator knows is going
// away (maintenance, a failover): nothing is sent to it and no row is
// charged meanwhile.
func (d *Dependency) Trip(reason string) {
	if reason == "" {
		reason = "tripped by hand"
	}
	from := d.State()
	d.mu.Lock()
	d.tripped = reason
	d.mu.Unlock()
	if from != DependencyOpen {
		d.notify(stateChange{from: from, to: DependencyOpen, manual: trippedByOperator + ": " + reason})
	}
}

// Reset closes the breaker now, whether it opened by itself or was tripped
// by hand, with its counts at zero: the next sweep sends.
func (d *Dependency) Reset() {
	from := d.State()
	fresh := d.newBreaker()
	d.mu.Lock()
	d.tripped = ""
	d.cb = fresh
	d.mu.Unlock()
	if from != DependencyClosed {
		d.notify(stateChange{from: from, to: DependencyClosed, manual: resetByOperator})
	}
}

// Tripped returns the reason the breaker was tripped by hand, or "".
func (d *Dependency) Tripped() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tripped
}

func (d *Dependency) breaker() *gobreaker.TwoStepCircuitBreaker[struct{}] {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cb
}

// ErrBrokerOpen wraps the breaker's refusals. It is of the local class: nothing
// was sent, so the rows count no attempt.
var ErrBrokerOpen = errors.New("broker circuit breaker is open: nothing sent")

// Allow asks to make one send. While the breaker is open, or half-open with its
// trial out, it refuses with a local-class error wrapping ErrBrokerOpen.
// Otherwise the caller sends and then calls done exactly once with its verdict
// and, for BrokerDown, the failure (which names the change in logs and alerts).
func (d *Dependency) Allow() (done func(v Verdict, cause error), err error) {
	if reason := d.Tripped(); reason != "" {
		return nil, producer.NewLocalError(fmt.Errorf("%w (tripped by an operator: %s)", ErrBrokerOpen, reason))
	}
	finish, err := d.breaker().Allow()
	if err != nil {
		return nil, producer.NewLocalError(fmt.Errorf("%w (%v)", ErrBrokerOpen, err))
	}
	return func(v Verdict, cause error) {
		switch v {
		case BrokerUp:
			finish(nil)
		case BrokerDown:
			text := "the broker failed"
			if cause != nil {
				text = cause.Error()
			}
			// Noted before finish: gobreaker reports the change of state this
			// failure causes from inside it, and its reason names the failure.
			d.mu.Lock()
			d.lastErr = text
			d.mu.Unlock()
			finish(errBrokerDown)
		default:
			finish(errNoVerdict)
		}
	}, nil
}

func fromGobreaker(s gobreaker.State) DependencyState {
	switch s {
	case gobreaker.StateOpen:
		return DependencyOpen
	case gobreaker.StateHalfOpen:
		return DependencyHalfOpen
	default:
		return DependencyClosed
	}
}

func (d *Dependency) notifyLoop() {
	defer d.wg.Done()
	for {
		select {
		case c := <-d.changes:
			d.deliver(c)
		case <-d.done:
			for { // deliver what came before Close
				select {
				case c := <-d.changes:
					d.deliver(c)
				default:
					return
				}
			}
		}
	}
}

// AlertKeyBroker is the key of the broker breaker's alerts; AlertKeyTopic
// returns a topic breaker's.
const AlertKeyBroker = "broker-circuit-breaker"

// AlertKeyTopic returns the key of topic's breaker alerts.
func AlertKeyTopic(topic string) string { return "topic-breaker/" + topic }

// deliver tells the observer, then the alerter, about one change.
func (d *Dependency) deliver(c stateChange) {
	reason := changeReason(c, d.cfg)
	if d.cfg.OnStateChange != nil {
		d.cfg.OnStateChange(c.from, c.to, reason)
	}
	if d.cfg.Alerter == nil {
		return
	}
	// One condition, keyed: open and half-open fire it (a notifier groups the
	// reopenings of a long outage), closed resolves it.
	severity, status := alert.Info, alert.Firing
	switch {
	case c.to == DependencyOpen && c.manual != "":
		severity = alert.Warning // an operator's decision, not an outage found
	case c.to == DependencyOpen:
		severity = alert.Critical
	case c.to == DependencyClosed:
		status = alert.Resolved
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = d.cfg.Alerter.Alert(ctx, alert.Alert{Time: time.Now().UTC(), Severity: severity, Component: "dependency-breaker",
		Key: AlertKeyBroker, Status: status, Summary: fmt.Sprintf("broker circuit breaker %s: %s", c.to, reason)})
}

func changeReason(c stateChange, cfg DependencyConfig) string {
	switch {
	case c.manual != "":
		return c.manual
	case c.from == DependencyClosed && c.to == DependencyOpen:
		return fmt.Sprintf("%d sends in a row failed (last: %s); no send for %s", cfg.Failures, c.lastErr, cfg.OpenDuration)
	case c.to == DependencyHalfOpen:
		return fmt.Sprintf("open for %s: one trial batch goes through", cfg.OpenDuration)
	case c.from == DependencyHalfOpen && c.to == DependencyOpen:
		return fmt.Sprintf("the trial batch failed (%s); no send for %s", c.lastErr, cfg.OpenDuration)
	case c.to == DependencyClosed:
		return "the trial batch succeeded"
	default:
		return ""
	}
}

// State returns the breaker's state: open while tripped by hand. mu is never
// held while calling into gobreaker, which calls back under its own lock.
func (d *Dependency) State() DependencyState {
	d.mu.Lock()
	cb, tripped := d.cb, d.tripped
	d.mu.Unlock()
	if tripped != "" {
		return DependencyOpen
	}
	return fromGobreaker(cb.State())
}

// Counts returns the breaker's counts in its current state.
func (d *Dependency) Counts() gobreaker.Counts { return d.breaker().Counts() }

// Close stops the notifier, after it has delivered the changes already made.
// Later calls do nothing.
func (d *Dependency) Close(ctx context.Context) error {
	d.closeOnce.Do(func() {
		close(d.done)
		waited := make(chan struct{})
		go func() { d.wg.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-ctx.Done():
		}
	})
	return nil
}

// Retry is the in-call retry of one send: transient and broker-class failures
// are tried again with exponential backoff and full jitter, up to Attempts
// tries and within the send's context (the sweeper bounds it by
// --send-timeout). Other classes are not retried: a missing topic or a bad row
// will not get better in a second. Zero fields mean their defaults.
type Retry struct {
	// Attempts is how many times one send is tried in all (1: no retry).
	// Defaults to RetryAttemptsDefault.
	Attempts int
	// Initial and Max bound the backoff between tries: the n-th wait is a
	// random duration in [0, min(Max, Initial·2ⁿ)) (full jitter). Default to
	// RetryInitialDefault and RetryMaxDefault.
	Initial, Max time.Duration
	// Rand returns a number in [0, 1) for the jitter. Defaults to math/rand/v2;
	// tests inject their own.
	Rand func() float64
	// OnRetry, when set, is called before each try after the first, with the
	// failure that is being retried (for a retries metric).
	OnRetry func(err error)
}

// WithDefaults returns r with zero fields set to their defaults.
func (r Retry) WithDefaults() Retry {
	if r.Attempts <= 0 {
		r.Attempts = RetryAttemptsDefault
	}
	if r.Initial <= 0 {
		r.Initial = RetryInitialDefault
	}
	if r.Max <= 0 {
		r.Max = RetryMaxDefault
	}
	if r.Rand == nil {
		r.Rand = rand.Float64
	}
	return r
}

// Do calls try until it succeeds, fails with a class retrying cannot help, the
// attempts run out, or the next wait would outlast ctx's deadline. It returns
// the last failure itself, so the rows and the breaker see what went wrong, not
// just that time ran out.
func (r Retry) Do(ctx context.Context, try func(context.Context) error) error {
	r = r.WithDefaults()
	tries := 0
	// cause is the last failure that was not the send's own deadline: when the
	// final try runs into the deadline, it says why the tries failed.
	var last, cause error
	retryable := func(err error) bool {
		c := producer.ClassOf(err)
		return c == producer.ClassTransient || c == producer.ClassBroker
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		tries++
		if tries > 1 && r.OnRetry != nil {
			r.OnRetry(last)
		}
		last = try(ctx)
		if last == nil {
			return struct{}{}, nil
		}
		if ctx.Err() == nil || !errors.Is(last, ctx.Err()) {
			cause = last
		}
		if !retryable(last) {
			return struct{}{}, backoff.Permanent(last)
		}
		return struct{}{}, last
	}, backoff.WithBackOff(untilDeadline{NewFullJitter(r.Initial, r.Max, r.Rand), ctx}),
		backoff.WithMaxTries(uint(r.Attempts)),
		backoff.WithMaxElapsedTime(0))
	switch {
	case err == nil:
		return nil
	case last != nil && !retryable(last):
		return last // not retried; also unwraps backoff's Permanent on the last try
	case last != nil && ctx.Err() != nil && !errors.Is(last, ctx.Err()):
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err() // stopping: local
		}
		return fmt.Errorf("send deadline reached after %d tries: %w", tries, last)
	case last != nil && cause != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && errors.Is(last, ctx.Err()):
		// The last try was cut short by the deadline (on a slow machine, or a
		// broker that answers slowly): the failure before it is the news.
		return fmt.Errorf("send deadline reached after %d tries: %w", tries, cause)
	case last != nil && tries > 1:
		return fmt.Errorf("after %d tries: %w", tries, last)
	case last != nil:
		return last
	default:
		return err
	}
}

// untilDeadline stops a backoff whose next wait would end after ctx's deadline:
// waiting out the send's time to then not try again helps nobody.
type untilDeadline struct {
	backoff.BackOff
	ctx context.Context
}

func (u untilDeadline) NextBackOff() time.Duration {
	next := u.BackOff.NextBackOff()
	if dl, ok := u.ctx.Deadline(); ok && next != backoff.Stop && time.Until(dl) < next {
		return backoff.Stop
	}
	return next
}

// FullJitter is exponential backoff with full jitter: the n-th delay is random
// in [0, min(max, initial·2ⁿ)). The exponential part is backoff's own; only the
// jitter is drawn here, from rnd, so tests can make it deterministic.
type FullJitter struct {
	exp *backoff.ExponentialBackOff
	rnd func() float64
}

// NewFullJitter returns a full-jitter backoff.
func NewFullJitter(initial, maxDelay time.Duration, rnd func() float64) *FullJitter {
	exp := backoff.NewExponentialBackOff()
	exp.InitialInterval = initial
	exp.MaxInterval = maxDelay
	exp.Multiplier = 2
	exp.RandomizationFactor = 0
	return &FullJitter{exp: exp, rnd: rnd}
}

// NextBackOff returns the next delay.
func (f *FullJitter) NextBackOff() time.Duration {
	d := f.exp.NextBackOff()
	if d == backoff.Stop {
		return d
	}
	return time.Duration(f.rnd() * float64(d))
}

// Reset starts the sequence over.
func (f *FullJitter) Reset() { f.exp.Reset() }
