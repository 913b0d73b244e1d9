package breaker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/outbox-sweeper/sweeper/producer"
)

// Defaults for [Retry].
const (
	RetryAttemptsDefault = 5
	RetryInitialDefault  = 200 * time.Millisecond
	RetryMaxDefault      = 5 * time.Second
)

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
