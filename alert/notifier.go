package alert

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// The status of an alert about a condition (one with a Key): it began, or
// still holds (Firing), or it cleared (Resolved).
const (
	Firing   = "firing"
	Resolved = "resolved"
)

// Defaults for [NotifierConfig].
const (
	RepeatIntervalDefault = 4 * time.Hour // Alertmanager's repeat_interval
	GroupWindowDefault    = time.Minute
	QueueSizeDefault      = 256
	RetryInitialDefault   = time.Second
	RetryMaxDefault       = time.Minute
	RetryForDefault       = 15 * time.Minute
)

// NotifierConfig configures a [Notifier]. Zero fields take their defaults.
type NotifierConfig struct {
	// RepeatInterval is how often a condition that goes on firing is notified
	// again: the changes in between (a broker breaker that opens again after
	// each failed trial, every --breaker-open-duration) are grouped into the
	// next notification, which counts them (Alert.Repeats).
	RepeatInterval time.Duration
	// GroupWindow is how long a resolved notification waits: if its condition
	// fires again within it (a breaker that flaps), neither goes out, and the
	// condition is still the one that was notified.
	GroupWindow time.Duration
	// QueueSize bounds the alerts waiting for delivery. An alert that finds the
	// queue full is dropped: logged at error level, and told to OnDrop. The
	// queue fills only while the receiver fails or is slow, and it holds only
	// changes (repeats are grouped before they reach it).
	QueueSize int
	// RetryInitial and RetryMax bound the exponential backoff (with jitter)
	// between tries of a delivery that failed; RetryFor, how long one alert
	// is tried before it is dropped (told to OnDrop). Alerts behind it wait:
	// they go to the same receiver, which is failing. One the receiver
	// refuses for what it is (RefusedError: 400, 413, 415, 422) is dropped
	// at its first try.
	RetryInitial, RetryMax, RetryFor time.Duration
	// Echo, when set, is given every alert the notifier sends, once, as it
	// is queued, whatever becomes of its delivery: the log, which must not
	// repeat an alert at every retry of a failing webhook.
	Echo Alerter
	// Logger receives delivery failures and drops. Defaults to discarding.
	Logger *slog.Logger
	// OnDrop, when set, is told of each alert dropped, and why: "queue_full",
	// "undeliverable", or "closed" (raised after Close began). It must be
	// quick.
	OnDrop func(a Alert, why string)
	// Now is the clock of RepeatInterval; time.Now when nil. For tests.
	Now func() time.Time
}

func (c NotifierConfig) withDefaults() NotifierConfig {
	if c.RepeatInterval == 0 {
		c.RepeatInterval = RepeatIntervalDefault
	}
	if c.GroupWindow == 0 {
		c.GroupWindow = GroupWindowDefault
	}
	if c.QueueSize == 0 {
		c.QueueSize = QueueSizeDefault
	}
	if c.RetryInitial == 0 {
		c.RetryInitial = RetryInitialDefault
	}
	if c.RetryMax == 0 {
		c.RetryMax = RetryMaxDefault
	}
	if c.RetryFor == 0 {
		c.RetryFor = RetryForDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Notifier stands between whoever raises alerts and the receiver, as
// Alertmanager would: it groups the alerts of a condition (Alert.Key: its
// kind, and the topic when there is one; of one Alert.Outbox) so that a long outage notifies once,
// then every RepeatInterval, and once more when it clears; and it delivers in
// the background, trying a failed delivery again with backoff, so that a
// breaker changing state in the middle of a sweep never waits on a slow or
// failing receiver. Alerts without a Key are one-off notices, delivered as
// they come.
type Notifier struct {
	next Alerter
	cfg  NotifierConfig

	mu         sync.Mutex
	conditions map[string]*condition
	closed     bool
	ch         chan queued
	seq        uint64        // numbers the firing notifications queued
	stop       chan struct{} // closed by Close: retries end
	done       chan struct{} // closed when the delivery loop has ended
}

// condition is what the notifier knows of one Key of one Outbox.
type condition struct {
	since    time.Time // when it began firing
	notified time.Time // when its last firing notification was queued
	severity string    // the severity it was last notified with
	repeats  int       // firing alerts grouped since
	resolve  *time.Timer
	resolved Alert // what the timer sends
	// unheard says its last firing notification was dropped (the queue was
	// full, or the receiver never took it): the receiver has not heard it
	// fire, so its next firing goes out at once, and its resolution nowhere.
	// Counted as notified, a dropped firing held back the firings after it
	// for RepeatInterval, and the receiver got a resolved for an alert it
	// never saw (an independent review, 2026-11-29).
	unheard bool
	// heard says a firing notification of it reached the receiver: its
	// resolution then goes out, whatever became of a later one (a repeat
	// dropped while the receiver was down).
	heard bool
	// last numbers its latest firing notification queued: a drop of an
	// earlier one (tried for RetryFor while a graver one queued behind it)
	// leaves it heard.
	last uint64
}

// queued is an alert waiting for delivery; of a condition's firing
// notification, that condition and the notification's number.
type queued struct {
	a   Alert
	c   *condition
	seq uint64
}

// NewNotifier starts a notifier in front of next (nil: alerts go to Echo
// only).
func NewNotifier(next Alerter, cfg NotifierConfig) *Notifier {
	cfg = cfg.withDefaults()
	n := &Notifier{next: next, cfg: cfg, conditions: map[string]*condition{},
		ch: make(chan queued, cfg.QueueSize), stop: make(chan struct{}), done: make(chan struct{})}
	go n.loop()
	return n
}

// Alert takes a, groups it with its condition's, and returns at once; the
// error says it was dropped (the queue is full, or the notifier closed).
func (n *Notifier) Alert(_ context.Context, a Alert) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a.Key == "" || (a.Status != Firing && a.Status != Resolved) {
		return n.enqueue(queued{a: a})
	}
	key := conditionKey(a)
	c := n.conditions[key]
	if a.Status == Resolved {
		if c == nil {
			return nil // never notified: nothing to clear
		}
		if c.resolve != nil {
			c.resolve.Stop()
		}
		if c.unheard && !c.heard {
			delete(n.conditions, key) // the receiver never heard it fire
			return nil
		}
		a.Repeats, a.FiringSince = c.repeats, timePtr(c.since)
		if n.cfg.GroupWindow < 0 {
			delete(n.conditions, key)
			return n.enqueue(queued{a: a})
		}
		c.resolved = a
		var t *time.Timer
		t = time.AfterFunc(n.cfg.GroupWindow, func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.conditions[key] == c && c.resolve == t {
				delete(n.conditions, key)
				if c.heard || !c.unheard {
					_ = n.enqueue(queued{a: c.resolved})
				}
			}
		})
		c.resolve = t
		return nil
	}
	now := n.cfg.Now()
	if c != nil {
		if c.resolve != nil { // back within the group window: the same incident goes on
			c.resolve.Stop()
			c.resolve = nil
		}
		// A graver alert of the condition (an automatic trip after an
		// operator's) is news: it goes out at once.
		if !c.unheard && now.Sub(c.notified) < n.cfg.RepeatInterval && rank(a.Severity) <= rank(c.severity) {
			c.repeats++
			return nil
		}
	} else {
		c = &condition{since: now}
		n.conditions[key] = c
	}
	a.Repeats, a.FiringSince = c.repeats, timePtr(c.since)
	n.seq++
	c.notified, c.repeats, c.severity, c.unheard, c.last = now, 0, a.Severity, false, n.seq
	return n.enqueue(queued{a: a, c: c, seq: n.seq}) // a drop marks it unheard again
}

// conditionKey is the key of a's condition in n.conditions.
func conditionKey(a Alert) string {
	if a.Outbox != "" {
		return a.Outbox + "\x00" + a.Key
	}
	return a.Key
}

// rank orders severities: info, warning, critical.
func rank(severity string) int {
	switch severity {
	case Critical:
		return 2
	case Warning:
		return 1
	}
	return 0
}

func timePtr(t time.Time) *time.Time {
	u := t.UTC()
	return &u
}

// enqueue queues q for delivery. Call with mu held.
func (n *Notifier) enqueue(q queued) error {
	a := q.a
	if n.cfg.Echo != nil && !n.closed {
		_ = n.cfg.Echo.Alert(context.Background(), a)
	}
	if n.next == nil {
		return nil
	}
	if n.closed {
		n.drop(q, "closed")
		return fmt.Errorf("alert not sent: the notifier is closed")
	}
	select {
	case n.ch <- q:
		return nil
	default:
		n.drop(q, "queue_full")
		return fmt.Errorf("alert dropped: %d alerts already wait for delivery (the receiver fails or is slow)", n.cfg.QueueSize)
	}
}

// drop tells of a dropped alert. Call with mu held.
func (n *Notifier) drop(q queued, why string) {
	a := q.a
	n.cfg.Logger.Error("alert dropped", "why", why, "severity", a.Severity, "component", a.Component, "key", a.Key,
		"status", a.Status, "summary", a.Summary)
	n.unheard(q)
	if n.cfg.OnDrop != nil {
		n.cfg.OnDrop(a, why)
	}
}

// unheard notes that q, a condition's latest firing notification, never
// reached the receiver (see condition.unheard). Call with mu held.
func (n *Notifier) unheard(q queued) {
	if c := q.c; c != nil && n.conditions[conditionKey(q.a)] == c && c.last == q.seq {
		c.unheard = true
	}
}

func (n *Notifier) loop() {
	defer close(n.done)
	for q := range n.ch {
		n.deliver(q)
	}
}

// deliver tries a until it goes, RetryFor has passed, or Close has begun (a
// failing receiver then gets one try per alert still queued).
func (n *Notifier) deliver(q queued) {
	a := q.a
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.Multiplier = n.cfg.RetryInitial, n.cfg.RetryMax, 2
	giveUp := time.Now().Add(n.cfg.RetryFor)
	for tries := 1; ; tries++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := n.next.Alert(ctx, a)
		cancel()
		if err == nil {
			if q.c != nil {
				n.mu.Lock()
				if n.conditions[conditionKey(a)] == q.c {
					q.c.heard = true
				}
				n.mu.Unlock()
			}
			return
		}
		wait := b.NextBackOff()
		closing := false
		select {
		case <-n.stop:
			closing = true
		default:
		}
		_, refused := errors.AsType[*RefusedError](err)
		if closing || refused || time.Now().Add(wait).After(giveUp) {
			n.cfg.Logger.Error("alert not delivered; dropped", "component", a.Component, "key", a.Key, "tries", tries, "err", err)
			n.mu.Lock()
			n.unheard(q)
			n.mu.Unlock()
			if n.cfg.OnDrop != nil {
				n.cfg.OnDrop(a, "undeliverable")
			}
			return
		}
		n.cfg.Logger.Warn("alert not delivered; trying again", "component", a.Component, "key", a.Key, "tries", tries,
			"retry_in", wait.Round(time.Millisecond), "err", err)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-n.stop:
			t.Stop()
		}
	}
}

// Close stops taking alerts, sends the resolved notifications still held in
// their group window, and waits, at most until ctx ends, for the queued
// alerts to be delivered (one try each). Call it once.
func (n *Notifier) Close(ctx context.Context) {
	n.mu.Lock()
	for key, c := range n.conditions {
		if c.resolve != nil {
			// A timer that has fired but waits for mu finds its condition
			// gone and sends nothing: the alert goes out here, once.
			c.resolve.Stop()
			delete(n.conditions, key)
			if c.heard || !c.unheard {
				_ = n.enqueue(queued{a: c.resolved})
			}
		}
	}
	n.closed = true
	close(n.stop)
	close(n.ch)
	n.mu.Unlock()
	select {
	case <-n.done:
	case <-ctx.Done():
	}
}
