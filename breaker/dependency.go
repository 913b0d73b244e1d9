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

// DependencyConfig configures [Guard]. Zero fields mean their defaults.
type DependencyConfig struct {
	// Failures is how many sends in a row must fail to open the breaker. A send
	// is one batch after its retries. Defaults to BreakerFailuresDefault.
	Failures int
	// OpenDuration is how long the breaker stays open before letting one trial
	// batch through. Defaults to BreakerOpenDurationDefault.
	OpenDuration time.Duration
	// RetryAttempts is how many times one send is tried in all (1: no retry).
	// Defaults to RetryAttemptsDefault.
	RetryAttempts int
	// RetryInitial and RetryMax bound the backoff between tries: the n-th wait
	// is a random duration in [0, min(RetryMax, RetryInitial·2ⁿ)) (full jitter).
	// Default to RetryInitialDefault and RetryMaxDefault.
	RetryInitial, RetryMax time.Duration
	// Rand returns a number in [0, 1) for the jitter. Defaults to math/rand/v2;
	// tests inject their own.
	Rand func() float64
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
	if c.RetryAttempts <= 0 {
		c.RetryAttempts = RetryAttemptsDefault
	}
	if c.RetryInitial <= 0 {
		c.RetryInitial = RetryInitialDefault
	}
	if c.RetryMax <= 0 {
		c.RetryMax = RetryMaxDefault
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	return c
}

// Guarded is a producer behind the dependency breaker and in-call retries.
//
// How retries and the breaker compose: Send retries transient failures of one
// batch with exponential backoff and full jitter, up to RetryAttempts tries and
// within the send's context (the sweeper bounds it by --send-timeout). Only the
// send's final outcome reaches the breaker: with the defaults, the breaker opens
// after 5 batches in a row failed 5 tries each. Topic- and message-class
// failures are not retried, and count as successes for the breaker: the broker
// answered, and a missing topic is not a broker outage. A cancelled send counts
// for neither.
//
// While the breaker is open, Send fails at once with a local-class error (the
// rows were never sent, so they count no attempt), and Blocked tells the sweeper
// not to page at all. After OpenDuration one trial batch goes through; its
// success closes the breaker.
type Guarded struct {
	producer.Producer
	cfg DependencyConfig
	cb  *gobreaker.CircuitBreaker[struct{}]

	mu        sync.Mutex
	lastErr   string // the last failure, for the reason of a change
	changes   chan stateChange
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
}

type stateChange struct {
	from, to DependencyState
	lastErr  string
}

// Guard puts p behind a dependency breaker and in-call retries. Call Close to
// stop its notifier (it also closes p).
func Guard(p producer.Producer, cfg DependencyConfig) *Guarded {
	cfg = cfg.withDefaults()
	// Changes are few (each open lasts OpenDuration); the buffer absorbs a slow
	// alerter without blocking gobreaker, which calls us under its lock.
	g := &Guarded{Producer: p, cfg: cfg, changes: make(chan stateChange, 1024), done: make(chan struct{})}
	g.cb = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        "broker",
		MaxRequests: 1,
		Timeout:     cfg.OpenDuration,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= uint32(cfg.Failures) },
		IsSuccessful: func(err error) bool {
			if err == nil {
				return true
			}
			c := producer.ClassOf(err)
			return c == producer.ClassTopic || c == producer.ClassMessage
		},
		IsExcluded: func(err error) bool { return err != nil && producer.ClassOf(err) == producer.ClassLocal },
		// gobreaker calls this under its lock: hand the change to the notifier
		// goroutine, never call back into the breaker here.
		OnStateChange: func(_ string, from, to gobreaker.State) {
			g.mu.Lock()
			last := g.lastErr
			g.mu.Unlock()
			select {
			case g.changes <- stateChange{fromGobreaker(from), fromGobreaker(to), last}:
			default: // a burst of changes beyond the buffer: the state is what counts
			}
		},
	})
	g.wg.Add(1)
	go g.notifyLoop()
	return g
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

func (g *Guarded) notifyLoop() {
	defer g.wg.Done()
	for {
		select {
		case c := <-g.changes:
			g.deliver(c)
		case <-g.done:
			for { // deliver what came before Close
				select {
				case c := <-g.changes:
					g.deliver(c)
				default:
					return
				}
			}
		}
	}
}

// deliver tells the observer, then the alerter, about one change.
func (g *Guarded) deliver(c stateChange) {
	reason := changeReason(c, g.cfg)
	if g.cfg.OnStateChange != nil {
		g.cfg.OnStateChange(c.from, c.to, reason)
	}
	if g.cfg.Alerter == nil {
		return
	}
	severity := alert.Info
	if c.to == DependencyOpen {
		severity = alert.Critical
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = g.cfg.Alerter.Alert(ctx, alert.Alert{Time: time.Now().UTC(), Severity: severity, Component: "dependency-breaker",
		Summary: fmt.Sprintf("broker circuit breaker %s: %s", c.to, reason)})
}

func changeReason(c stateChange, cfg DependencyConfig) string {
	switch {
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

// State returns the breaker's state.
func (g *Guarded) State() DependencyState { return fromGobreaker(g.cb.State()) }

// Counts returns the breaker's counts in its current state.
func (g *Guarded) Counts() gobreaker.Counts { return g.cb.Counts() }

// Blocked reports whether the breaker is open: the sweeper then reads no page.
func (g *Guarded) Blocked() bool { return g.cb.State() == gobreaker.StateOpen }

// Probing reports whether the breaker is half-open: it lets one trial send
// through and refuses the others, so the sweeper then sends one batch.
func (g *Guarded) Probing() bool { return g.cb.State() == gobreaker.StateHalfOpen }

// Batches cuts batches through the producer. A transient failure to cut (the
// producer needs its broker for that and cannot reach it) counts as a failed
// send: the sweeper sends nothing then, and without this the breaker would
// never see the outage. Successes do not count, since no broker was asked.
func (g *Guarded) Batches(ctx context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	batches, err := g.Producer.Batches(ctx, topic, msgs)
	if err != nil && len(producer.MessageIDs(err)) == 0 && producer.ClassOf(err) == producer.ClassTransient {
		_, _ = g.cb.Execute(func() (struct{}, error) {
			g.mu.Lock()
			g.lastErr = err.Error()
			g.mu.Unlock()
			return struct{}{}, err
		})
	}
	return batches, err
}

// errBlocked wraps the breaker's refusals as local failures: nothing was sent.
func errBlocked(err error) error {
	return producer.NewLocalError(fmt.Errorf("broker circuit breaker: %w", err))
}

// Send sends b with retries, through the breaker.
func (g *Guarded) Send(ctx context.Context, b producer.Batch) error {
	_, err := g.cb.Execute(func() (struct{}, error) {
		err := g.retry(ctx, b)
		// Noted before Execute returns: gobreaker reports the change of state
		// this failure causes from inside Execute, and its reason names it.
		if err != nil && producer.ClassOf(err) == producer.ClassTransient {
			g.mu.Lock()
			g.lastErr = err.Error()
			g.mu.Unlock()
		}
		return struct{}{}, err
	})
	if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
		return errBlocked(err)
	}
	return err
}

// retry tries b until it succeeds, fails with a class retrying cannot help, the
// attempts run out, or the next wait would outlast ctx's deadline. It returns
// the last failure itself, so the rows and the breaker see what went wrong, not
// just that time ran out.
func (g *Guarded) retry(ctx context.Context, b producer.Batch) error {
	tries := 0
	var last error
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		tries++
		last = g.Producer.Send(ctx, b)
		if last == nil {
			return struct{}{}, nil
		}
		if producer.ClassOf(last) != producer.ClassTransient {
			return struct{}{}, backoff.Permanent(last)
		}
		return struct{}{}, last
	}, backoff.WithBackOff(untilDeadline{NewFullJitter(g.cfg.RetryInitial, g.cfg.RetryMax, g.cfg.Rand), ctx}),
		backoff.WithMaxTries(uint(g.cfg.RetryAttempts)),
		backoff.WithMaxElapsedTime(0))
	switch {
	case err == nil:
		return nil
	case last != nil && producer.ClassOf(last) != producer.ClassTransient:
		return last // not retried; also unwraps backoff's Permanent on the last try
	case last != nil && ctx.Err() != nil && !errors.Is(last, ctx.Err()):
		if errors.Is(ctx.Err(), context.Canceled) {
			return ctx.Err() // stopping: local
		}
		return fmt.Errorf("send deadline reached after %d tries: %w", tries, last)
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

// Close stops the notifier, after it has delivered the changes already made,
// and closes the producer. Later calls do nothing.
func (g *Guarded) Close(ctx context.Context) error {
	var err error
	g.closeOnce.Do(func() {
		close(g.done)
		waited := make(chan struct{})
		go func() { g.wg.Wait(); close(waited) }()
		select {
		case <-waited:
		case <-ctx.Done():
		}
		err = g.Producer.Close(ctx)
	})
	return err
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
