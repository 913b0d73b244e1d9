package breaker

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// State is a topic's breaker state.
type State int

const (
	// StateClosed: the topic is sent normally; failures are counted.
	StateClosed State = iota
	// StateTripped: the topic is left out of paging until its cooldown ends.
	StateTripped
	// StateHalfOpen: the cooldown has ended; the next sweep sends one trial batch.
	StateHalfOpen
)

// String returns the state's name, as in logs and metric labels.
func (s State) String() string {
	switch s {
	case StateClosed:
		return "closed"
	case StateTripped:
		return "tripped"
	case StateHalfOpen:
		return "half-open"
	default:
		return fmt.Sprintf("state(%d)", int(s))
	}
}

// Defaults for [Settings].
const (
	FailureThresholdDefault = 1
	FailureWindowDefault    = time.Minute
	CooldownTicksDefault    = 10
	MaxCooldownTicksDefault = 300
	MaxTrialsDefault        = 1000
	ForgetAfterDefault      = 10 * time.Minute
)

// Settings configures a [Topics] breaker. The zero value of each field means its
// default.
type Settings struct {
	// FailureThreshold is how many failed batches within FailureWindow trip a
	// topic. Defaults to FailureThresholdDefault: the first failed batch (after
	// the producer's own retries) trips it.
	FailureThreshold int
	// FailureWindow is how far back failures count. Defaults to
	// FailureWindowDefault.
	FailureWindow time.Duration
	// CooldownTicks is how many ticks a tripped topic is left out. Defaults to
	// CooldownTicksDefault.
	CooldownTicks int
	// Cooldowns overrides CooldownTicks for given topics.
	Cooldowns map[string]int
	// MaxCooldownTicks caps the cooldown, which doubles each time a half-open
	// trial fails. Defaults to MaxCooldownTicksDefault.
	MaxCooldownTicks int
	// MaxTrials bounds the half-open topics one plan hands a trial. The
	// others are left out of that plan and take their turn at the next ones,
	// in name order from where the last plan stopped, so each waits at most
	// (half-open topics / MaxTrials) plans. Why: every trial costs the sweep
	// that carries it a probe of the listing and a send or a check, and
	// topics tripped together come out of their cooldown together: 100,000
	// topics tripped by a flood all came back on one tick, and that one sweep
	// took 1.7 s while a healthy topic's rows waited behind it. The cap also
	// spreads the next cooldowns of the topics whose trial fails, since they
	// trip again plan by plan. Defaults to MaxTrialsDefault.
	MaxTrials int
	// ForgetAfter is how long a closed topic's state (its generation, its
	// failures) is kept after its last failure or change: then OnTick forgets
	// it, as if the topic had never failed. Why: rows that each carry a topic
	// of their own would otherwise grow the breaker by one entry per topic
	// ever seen, and each plan with it. It is never less than FailureWindow,
	// and long enough that no batch planned before the topic's last change is
	// still out. Defaults to ForgetAfterDefault.
	ForgetAfter time.Duration
	// Now is the clock for FailureWindow, ForgetAfter and TrippedAt. Defaults
	// to time.Now.
	Now func() time.Time
	// OnStateChange is called after every change of a topic's state, outside the
	// breaker's lock, so it may call back into the breaker.
	OnStateChange func(topic string, from, to State, reason string)
}

// TopicStatus describes a topic that is not closed, for operators. It never
// holds a payload.
type TopicStatus struct {
	Topic             string    `json:"topic"`
	State             string    `json:"state"`
	CooldownTicksLeft int       `json:"cooldown_ticks_left"`
	Trips             int       `json:"trips"` // times tripped in a row
	TrippedAt         time.Time `json:"tripped_at"`
	LastError         string    `json:"last_error"`
}

// Plan is what the breaker allows for one sweep. Take it at the start of the
// sweep, after OnTick.
type Plan struct {
	// Excluded lists the topics to leave out of paging: tripped ones, and
	// half-open ones whose trial batch is already out or whose turn has not
	// come (Settings.MaxTrials). In no particular order: sorting it cost a
	// plan half its time with 100,000 topics tripped, and every sweep takes
	// a plan.
	Excluded []string
	// Trials lists the half-open topics this sweep may send one batch of.
	Trials map[string]bool
	gens   map[string]uint64
	// closed is the generation of a topic not in gens (closed): 0, or, in a
	// plan read from Redis, the sequence of generations as the plan read it,
	// so that an outcome of a batch planned before a close there is told
	// from one planned after it (Redis keeps no generation of a closed
	// topic).
	closed uint64
}

// Gen returns the topic's generation when the plan was made. Report outcomes
// with it, so that a batch started before a trip or a reset does not count
// after it.
func (p Plan) Gen(topic string) uint64 {
	if g, ok := p.gens[topic]; ok {
		return g
	}
	return p.closed
}

// Topics is the per-topic breaker of the outbox ADR, in memory. It is safe for
// concurrent use.
//
//	           failures ≥ threshold within window,
//	           or a topic-class failure
//	closed ───────────────────────────────────────▶ tripped
//	  ▲                                               │ cooldown ticks pass (OnTick)
//	  │ trial batch succeeds                          ▼
//	  └──────────────────────────────────────────── half-open
//	                trial fails: tripped again, cooldown doubled (capped)
//
// Every transition bumps the topic's generation; an outcome reported with an
// older generation is ignored.
//
// Topic names are compared and handed on byte for byte, whether or not they are
// UTF-8 (a SQL_ASCII outbox holds topics that are not): the breaker must leave
// out exactly the rows that failed. OnStateChange and Tripped give them as
// they came; consumers that need text escape them (see package metrics).
type Topics struct {
	s Settings

	mu     sync.Mutex
	topics map[string]*topic
	// turn is the last topic a plan handed a trial when there were more
	// half-open topics than MaxTrials: the next plan starts after it.
	turn string
	// trips counts the trips made (TripCounter).
	trips atomic.Uint64
}

type topic struct {
	state     State
	gen       uint64
	failures  []time.Time // within the window, oldest first
	ticksLeft int
	cooldown  int // the cooldown the last trip used
	trips     int
	trippedAt time.Time
	lastError string
	trialOut  bool      // half-open: the trial batch was handed out
	seen      time.Time // the last failure or change, for ForgetAfter
}

// New returns a breaker with every topic closed.
func New(s Settings) *Topics {
	if s.FailureThreshold <= 0 {
		s.FailureThreshold = FailureThresholdDefault
	}
	if s.FailureWindow <= 0 {
		s.FailureWindow = FailureWindowDefault
	}
	if s.CooldownTicks <= 0 {
		s.CooldownTicks = CooldownTicksDefault
	}
	if s.MaxCooldownTicks <= 0 {
		s.MaxCooldownTicks = MaxCooldownTicksDefault
	}
	if s.MaxTrials <= 0 {
		s.MaxTrials = MaxTrialsDefault
	}
	if s.ForgetAfter <= 0 {
		s.ForgetAfter = ForgetAfterDefault
	}
	s.ForgetAfter = max(s.ForgetAfter, s.FailureWindow)
	if s.Now == nil {
		s.Now = time.Now
	}
	return &Topics{s: s, topics: make(map[string]*topic)}
}

type change struct {
	topic    string
	from, to State
	reason   string
}

// notify calls OnStateChange for each change, outside the lock.
func (b *Topics) notify(changes []change) {
	if b.s.OnStateChange == nil {
		return
	}
	for _, c := range changes {
		b.s.OnStateChange(c.topic, c.from, c.to, c.reason)
	}
}

// OnTick advances every tripped topic's cooldown by one tick; a topic whose
// cooldown has run out becomes half-open, so its trial comes in this tick. A
// half-open topic whose trial was handed out but never reported gets a new
// trial. A closed topic with nothing for ForgetAfter is forgotten.
func (b *Topics) OnTick() {
	b.mu.Lock()
	var changes []change
	now := b.s.Now()
	for name, t := range b.topics {
		switch t.state {
		case StateClosed:
			if now.Sub(t.seen) >= b.s.ForgetAfter {
				delete(b.topics, name) // deleting while ranging is safe in Go
			}
		case StateTripped:
			// Check, then count: a topic tripped with cooldown N is left out of
			// the N ticks after the one it tripped in, and tried in the next.
			if t.ticksLeft <= 0 {
				changes = append(changes, b.setState(name, t, StateHalfOpen, "cooldown over"))
			} else {
				t.ticksLeft--
			}
		case StateHalfOpen:
			t.trialOut = false
		}
	}
	b.mu.Unlock()
	b.notify(changes)
}

// Plan returns what the next sweep may do, and hands out up to MaxTrials of
// the half-open topics' trials (the others wait for a later plan): until
// OnTick, a later plan excludes the topics handed one.
func (b *Topics) Plan() Plan {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := Plan{Excluded: make([]string, 0, len(b.topics)), Trials: map[string]bool{}, gens: make(map[string]uint64, len(b.topics))}
	var waiting []string // half-open, trial not out
	for name, t := range b.topics {
		if t.gen != 0 { // Gen says 0 for the others
			p.gens[name] = t.gen
		}
		switch {
		case t.state == StateTripped, t.state == StateHalfOpen && t.trialOut:
			p.Excluded = append(p.Excluded, name)
		case t.state == StateHalfOpen:
			waiting = append(waiting, name)
		}
	}
	trials, later := takeTurns(waiting, &b.turn, b.s.MaxTrials)
	for _, name := range trials {
		p.Trials[name] = true
		b.topics[name].trialOut = true
	}
	p.Excluded = append(p.Excluded, later...)
	return p
}

// takeTurns splits the half-open topics waiting for a trial into those a plan
// tries (at most max) and those it leaves for later. When all fit, all are
// tried; otherwise the turns go in name order, starting after *turn and
// wrapping around, and *turn becomes the last one taken, so that every topic
// gets its trial within len(waiting)/max plans, however the set changes
// between them.
func takeTurns(waiting []string, turn *string, max int) (trials, later []string) {
	if len(waiting) <= max {
		return waiting, nil
	}
	slices.Sort(waiting)
	start, found := slices.BinarySearch(waiting, *turn)
	if found {
		start++
	}
	rotated := append(waiting[start:len(waiting):len(waiting)], waiting[:start]...)
	*turn = rotated[max-1]
	return rotated[:max], rotated[max:]
}

// Success reports a batch of topic accepted. A half-open topic closes and its
// failures are forgotten.
func (b *Topics) Success(name string, gen uint64) {
	b.closeHalfOpen(name, gen, "trial batch succeeded")
}

// Empty closes a half-open topic that has no row left to try (its rows
// expired, or were deleted): with no trial to send it would stay half-open
// until a row came, and never be forgotten.
func (b *Topics) Empty(name string, gen uint64) { b.closeHalfOpen(name, gen, "no rows left to try") }

func (b *Topics) closeHalfOpen(name string, gen uint64, reason string) {
	b.mu.Lock()
	t, ok := b.topics[name]
	if !ok || t.gen != gen {
		b.mu.Unlock()
		return
	}
	var changes []change
	if t.state == StateHalfOpen {
		changes = append(changes, b.close(name, t, reason))
	}
	b.mu.Unlock()
	b.notify(changes)
}

// Failure reports a failed batch of topic. It trips the topic when the failures
// within the window reach the threshold, at once when topicClass is set (the
// destination itself is wrong), and again, with the cooldown doubled, when a
// half-open trial fails. errText is kept for operators; it must not hold a
// payload.
func (b *Topics) Failure(name string, gen uint64, topicClass bool, errText string) {
	b.mu.Lock()
	t := b.topic(name)
	if t.gen != gen {
		b.mu.Unlock()
		return
	}
	now := b.s.Now()
	t.lastError = errText
	t.seen = now
	var changes []change
	switch t.state {
	case StateHalfOpen:
		t.cooldown = min(2*t.cooldown, b.s.MaxCooldownTicks)
		changes = append(changes, b.trip(name, t, now, t.cooldown, "trial batch failed: "+cause(errText)))
	case StateClosed:
		cutoff := now.Add(-b.s.FailureWindow)
		kept := t.failures[:0]
		for _, f := range t.failures {
			if f.After(cutoff) {
				kept = append(kept, f)
			}
		}
		t.failures = append(kept, now)
		switch {
		case topicClass:
			changes = append(changes, b.trip(name, t, now, b.cooldownOf(name), "topic-class failure: "+cause(errText)))
		case len(t.failures) >= b.s.FailureThreshold:
			changes = append(changes, b.trip(name, t, now, b.cooldownOf(name),
				fmt.Sprintf("%d failures within %s, the last: %s", len(t.failures), b.s.FailureWindow, cause(errText))))
		}
	}
	b.mu.Unlock()
	b.notify(changes)
}

// Trip trips topic by hand, for its configured cooldown. reason is what the
// state change reports and the list shows as its last error.
func (b *Topics) Trip(name, reason string) {
	b.mu.Lock()
	t := b.topic(name)
	var changes []change
	t.lastError = reason
	changes = append(changes, b.trip(name, t, b.s.Now(), b.cooldownOf(name), trippedByOperator+": "+reason))
	b.mu.Unlock()
	b.notify(changes)
}

// Reset closes topic by hand and forgets its failures.
func (b *Topics) Reset(name string) {
	b.mu.Lock()
	t, ok := b.topics[name]
	var changes []change
	if ok && t.state != StateClosed {
		changes = append(changes, b.close(name, t, resetByOperator))
	} else if ok {
		// A closed topic's failures are forgotten, without a change to
		// report; and those of batches sent before the reset must not count
		// after it: its generation moves.
		t.failures = nil
		t.gen++
	}
	b.mu.Unlock()
	b.notify(changes)
}

// Trips counts the trips made since New, of any topic and for any reason
// (TripCounter).
func (b *Topics) Trips() uint64 { return b.trips.Load() }

// Tripped lists the topics that are not closed, by topic name.
func (b *Topics) Tripped() []TopicStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []TopicStatus
	for _, name := range slices.Sorted(maps.Keys(b.topics)) {
		t := b.topics[name]
		if t.state == StateClosed {
			continue
		}
		out = append(out, t.status(name))
	}
	return out
}

// State returns topic's state.
func (b *Topics) State(name string) State {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.topics[name]; ok {
		return t.state
	}
	return StateClosed
}

// genOf returns topic's current generation.
func (b *Topics) genOf(name string) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t, ok := b.topics[name]; ok {
		return t.gen
	}
	return 0
}

func (b *Topics) topic(name string) *topic {
	t, ok := b.topics[name]
	if !ok {
		t = &topic{seen: b.s.Now()}
		b.topics[name] = t
	}
	return t
}

func (b *Topics) cooldownOf(name string) int {
	if c, ok := b.s.Cooldowns[name]; ok && c > 0 {
		return min(c, b.s.MaxCooldownTicks)
	}
	return min(b.s.CooldownTicks, b.s.MaxCooldownTicks)
}

// status returns topic's status and its current cooldown length, for copying it
// to Redis.
func (b *Topics) status(name string) (TopicStatus, int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.topics[name]
	if !ok || t.state == StateClosed {
		return TopicStatus{}, 0, false
	}
	return t.status(name), t.cooldown, true
}

func (t *topic) status(name string) TopicStatus {
	return TopicStatus{Topic: name, State: t.state.String(), CooldownTicksLeft: t.ticksLeft, Trips: t.trips,
		TrippedAt: t.trippedAt, LastError: t.lastError}
}

func (b *Topics) trip(name string, t *topic, now time.Time, cooldown int, reason string) change {
	b.trips.Add(1)
	t.cooldown = cooldown
	t.ticksLeft = cooldown
	t.trips++
	t.trippedAt = now
	t.failures = nil
	t.trialOut = false
	return b.setState(name, t, StateTripped, reason)
}

// mirror makes b, a Redis breaker's local shadow, hold the shared state as
// its last read found it, so that a plan made from the shadow while Redis
// does not answer keeps the trips other instances and operators made there:
// an operator's trip for a downstream migration, made through another
// instance, was sent to again by this one at the first Redis outage (an
// independent review, 2026-11-29). Each topic shared holds tripped or
// half-open is so here, with the ticks it has left; one it holds closed (not
// in shared) is closed here; keep names the topics whose local state stands
// (this instance's trips and resets that Redis does not hold yet). Nothing
// is told: each change was told where it was made.
func (b *Topics) mirror(shared map[string]remote, keep map[string]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for name, st := range shared {
		if keep[name] {
			continue
		}
		state := parseState(st.State)
		t, ok := b.topics[name]
		if !ok {
			t = &topic{}
			b.topics[name] = t
		}
		if t.state != state {
			b.setState(name, t, state, "")
			t.failures, t.trialOut = nil, false
		}
		t.ticksLeft, t.cooldown, t.trips, t.lastError = st.TicksLeft, st.Cooldown, st.Trips, st.LastError
		t.trippedAt = time.UnixMilli(st.TrippedAt)
	}
	for name, t := range b.topics {
		if _, ok := shared[name]; !ok && !keep[name] && t.state != StateClosed {
			b.close(name, t, "")
		}
	}
}

// close closes t and forgets its history. The topic stays in the map, closed,
// so its generation keeps counting: a batch begun before the close must not
// count after it. Call with b.mu held.
func (b *Topics) close(name string, t *topic, reason string) change {
	c := b.setState(name, t, StateClosed, reason)
	t.failures, t.trips, t.ticksLeft, t.cooldown, t.lastError, t.trialOut = nil, 0, 0, 0, "", false
	return c
}

// setState moves t to state and bumps its generation. Call with b.mu held.
func (b *Topics) setState(name string, t *topic, state State, reason string) change {
	c := change{topic: name, from: t.state, to: state, reason: reason}
	t.state = state
	t.gen++
	t.seen = b.s.Now()
	return c
}
