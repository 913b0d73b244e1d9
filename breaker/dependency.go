package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [DependencyConfig].
const (
	BreakerFailuresDefault     = 5
	BreakerOpenDurationDefault = 30 * time.Second
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
