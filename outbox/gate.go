package outbox

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
)

// gate is the one place that answers "may this topic send now, and if not,
// why, and until when". Every reason a topic does not send is one of its
// answers:
//
//	broker breaker open        nothing sends; no page is read     GateBrokerOpen
//	broker breaker half-open   one batch of one topic, alone      GateBrokerTrial
//	topic tripped              cooling down, for ticks            GateTripped
//	topic half-open            one trial batch, then it waits     GateTrial
//	topic backing off          transient failures in a row, until GateBackoff
//	topic halted               stopped for the rest of the sweep  GateHalted
//	                           (a failed or contended batch, its
//	                           trial sent)
//
// A sweep asks it once, at its start (open), after the broker breaker let it
// read: the answer (a gatePass) holds the topic breaker's plan and the topics
// backing off, and gathers the topics halted as the sweep goes. A topic
// tripped after the plan stops at the sweep's next page or batch of it
// (gatePass.tripped), not at the next sweep: an operator who trips a topic
// during a drain means now. Operators ask the gate through Sweeper.Gate and
// Sweeper.Gates, which change nothing.
type gate struct {
	topics breaker.Breaker
	// trips is topics, when it counts its trips: nil, and a trip made during
	// a sweep holds from the next.
	trips   breaker.TripCounter
	broker  BrokerBreaker // nil: none
	backoff *topicBackoff

	mu sync.Mutex
	// pass is the sweep in progress's, nil between sweeps; Gates reads its
	// halted topics under mu.
	pass *gatePass
}

// brokerState is the broker breaker's state; closed when there is none.
func (g *gate) brokerState() breaker.DependencyState {
	if g.broker == nil {
		return breaker.DependencyClosed
	}
	return g.broker.State()
}

// open takes a sweep's pass at now: the topic breaker's plan (which hands out
// the half-open topics' trials, so it is taken once a sweep, after OnTick),
// and the topics whose backoff has not ended.
func (g *gate) open(now time.Time) *gatePass {
	p := &gatePass{g: g, halted: map[string]bool{}}
	p.since.Store(new(map[string]bool))
	if g.trips != nil {
		// Read before the plan: a trip between the two is read again.
		p.trips.Store(g.trips.Trips())
	}
	p.plan = g.topics.Plan()
	waiting := g.backoff.waiting(now)
	p.backingOff = len(waiting) > 0
	p.excluded = slices.Concat(p.plan.Excluded, waiting)
	p.leftOut = make(map[string]bool, len(p.excluded))
	for _, t := range p.excluded {
		p.leftOut[t] = true
	}
	g.mu.Lock()
	g.pass = p
	g.mu.Unlock()
	return p
}

// close ends p's sweep: its halted topics may send at the next.
func (g *gate) close(p *gatePass) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pass == p {
		g.pass = nil
	}
}

// gatePass is the gate's answer for one sweep.
type gatePass struct {
	g    *gate
	plan breaker.Plan
	// excluded lists the topics left out of the sweep's paging (tripped,
	// their trial out, backing off), a topic twice if it is both; leftOut
	// holds them as a set.
	excluded []string
	leftOut  map[string]bool
	// backingOff says some of them wait out a backoff after failed batches.
	backingOff bool
	// halted holds the topics stopped for the rest of the sweep, for Gates
	// to read. The sweep's lanes write it, under g.mu; each pages on
	// without its own halted topics (it keeps them too), and a topic is
	// in one lane only, so no lane needs another's.
	halted map[string]bool

	// trips is the topic breaker's trip count when the pass last read it,
	// and since the topics tripped after the plan then (nil: none). refresh
	// serializes the reads of the breaker's list (with Redis a round trip)
	// that a moved count calls for, so that no lane answers from a list
	// older than the count it read.
	trips   atomic.Uint64
	since   atomic.Pointer[map[string]bool]
	refresh sync.Mutex
}

// trial says topic is half-open: it sends one batch, its trial.
func (p *gatePass) trial(topic string) bool { return p.plan.Trials[topic] }

// gen is topic's breaker generation in the plan: outcomes are reported with it.
func (p *gatePass) gen(topic string) uint64 { return p.plan.Gen(topic) }

// tripped reports whether topic was tripped after the plan was taken (an
// operator's trip, or, in a relay of several instances sharing the breaker,
// one this instance's failures made there): it stops
// sending for the rest of the sweep, its rows claimed and not sent left
// outstanding, as a contended topic's are.
func (p *gatePass) tripped(topic string) bool { return p.trippedSince()[topic] }

// haltTripped adds to halted the topics of live tripped after the plan.
func (p *gatePass) haltTripped(live []string, halted map[string]bool) {
	since := p.trippedSince()
	for _, t := range live {
		if since[t] {
			halted[t] = true
		}
	}
}

// trippedSince returns the topics tripped after the plan (nil: none),
// reading the breaker's list again when its trip count has moved. While the
// breaker makes no trip, that costs two atomic loads.
func (p *gatePass) trippedSince() map[string]bool {
	if p.g.trips == nil {
		return nil
	}
	if p.g.trips.Trips() == p.trips.Load() {
		return *p.since.Load()
	}
	p.refresh.Lock()
	defer p.refresh.Unlock()
	if n := p.g.trips.Trips(); n != p.trips.Load() {
		var since map[string]bool
		for _, ts := range p.g.topics.Tripped() {
			// The topics tripped at the plan are not paged at all.
			if ts.State == breaker.StateTripped.String() && !p.leftOut[ts.Topic] {
				if since == nil {
					since = map[string]bool{}
				}
				since[ts.Topic] = true
			}
		}
		p.since.Store(&since)
		// Stored once the list is read: a lane that reads the moved count
		// meanwhile waits for it. A trip made during the read moves the
		// count past n, and is read at the next question.
		p.trips.Store(n)
	}
	return *p.since.Load()
}

// halt stops topics for the rest of the sweep.
func (p *gatePass) halt(topics []string) {
	if len(topics) == 0 {
		return
	}
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	for _, t := range topics {
		p.halted[t] = true
	}
}

// GateReason says why a topic may not send now, or sends only a trial.
type GateReason string

const (
	// GateBrokerOpen: the broker breaker is open; no topic sends.
	GateBrokerOpen GateReason = "broker_open"
	// GateBrokerTrial: the broker breaker is half-open; one batch of one
	// topic is sent alone, and the rest wait for its outcome.
	GateBrokerTrial GateReason = "broker_trial"
	// GateTripped: the topic breaker tripped the topic; it waits out its
	// cooldown, counted in ticks.
	GateTripped GateReason = "tripped"
	// GateTrial: the topic is half-open; it sends one trial batch.
	GateTrial GateReason = "trial"
	// GateBackoff: the topic's sends failed transiently, in a row; it waits
	// until Until.
	GateBackoff GateReason = "backoff"
	// GateHalted: the topic stopped for the rest of the sweep in progress (a
	// batch failed or was held by another instance, or it sent its trial).
	GateHalted GateReason = "halted"
)

// TopicGate is the gate's answer for one topic: whether it may send now, and
// if not, why and until when. The admin API's /status can show it as it is.
type TopicGate struct {
	Topic string `json:"topic"`
	// Send says the topic may send now (a trial: one batch).
	Send bool `json:"send"`
	// Reason is why it may not send, or sends one batch only; "" when
	// nothing holds it.
	Reason GateReason `json:"reason,omitempty"`
	// Until is when it may send again, for a backoff; zero when that is not a
	// time (a cooldown ends after ticks, a halt at the next sweep).
	Until time.Time `json:"until,omitzero"`
	// CooldownTicks is how many ticks a tripped topic still waits.
	CooldownTicks int `json:"cooldown_ticks,omitempty"`
	// Detail is the error or reason behind it (the trip's last error).
	Detail string `json:"detail,omitempty"`
}

// Gate answers for topic, at now: may it send, and if not, why and until
// when. It changes nothing (the sweep's plan is not taken), and is safe to
// call from any goroutine; a topic breaker shared through Redis is asked
// there.
func (s *Sweeper) Gate(topic string, now time.Time) TopicGate {
	b := s.BrokerGate()
	if b == GateBrokerOpen {
		return TopicGate{Topic: topic, Reason: b}
	}
	tg := s.gate.answer(topic, now)
	if tg.Reason == "" {
		tg.Reason = b
	}
	return tg
}

// Gates lists, by topic, every topic the gate holds at now: tripped,
// half-open, backing off, or halted in the sweep in progress; one answer a
// topic, the strongest reason (tripped, then backoff, then halted). What the
// broker breaker holds, it holds for every topic: BrokerGate says it once,
// and Gate puts it first.
func (s *Sweeper) Gates(now time.Time) []TopicGate {
	g := s.gate
	out := map[string]TopicGate{}
	for _, ts := range g.topics.Tripped() {
		out[ts.Topic] = trippedGate(ts)
	}
	for _, b := range g.backoff.list() {
		if _, ok := out[b.Topic]; !ok && now.Before(b.Until) {
			out[b.Topic] = TopicGate{Topic: b.Topic, Reason: GateBackoff, Until: b.Until}
		}
	}
	g.mu.Lock()
	if g.pass != nil {
		for t := range g.pass.halted {
			if _, ok := out[t]; !ok {
				out[t] = TopicGate{Topic: t, Reason: GateHalted}
			}
		}
	}
	g.mu.Unlock()
	list := make([]TopicGate, 0, len(out))
	for _, tg := range out {
		list = append(list, tg)
	}
	slices.SortFunc(list, func(a, b TopicGate) int { return strings.Compare(a.Topic, b.Topic) })
	return list
}

// answer is what Gates says of topic at now, without the broker breaker's
// part, or Send with no reason when nothing holds it. It asks the topic
// breaker for its list only when topic is not closed: a failure's log line
// asks it, and with Redis each question is a round trip.
func (g *gate) answer(topic string, now time.Time) TopicGate {
	if g.topics.State(topic) != breaker.StateClosed {
		for _, ts := range g.topics.Tripped() {
			if ts.Topic == topic {
				return trippedGate(ts)
			}
		}
	}
	if until, ok := g.backoff.until(topic); ok && now.Before(until) {
		return TopicGate{Topic: topic, Reason: GateBackoff, Until: until}
	}
	g.mu.Lock()
	halted := g.pass != nil && g.pass.halted[topic]
	g.mu.Unlock()
	if halted {
		return TopicGate{Topic: topic, Reason: GateHalted}
	}
	return TopicGate{Topic: topic, Send: true}
}

// stopped is the gate's answer for topic at now, whose sending has just
// stopped for the rest of the sweep: what holds it past the sweep (a trip, a
// backoff), or else halted. The sweep adds the topic to its halted ones only
// once its page is sent, so answer alone would still say it may send.
func (g *gate) stopped(topic string, now time.Time) TopicGate {
	tg := g.answer(topic, now)
	if tg.Send && tg.Reason == "" {
		tg = TopicGate{Topic: topic, Reason: GateHalted}
	}
	return tg
}

// trippedGate is the answer for a topic the topic breaker does not hold
// closed: tripped for its cooldown, or half-open for one trial batch.
func trippedGate(ts breaker.TopicStatus) TopicGate {
	if ts.State == breaker.StateHalfOpen.String() {
		return TopicGate{Topic: ts.Topic, Send: true, Reason: GateTrial, Detail: ts.LastError}
	}
	return TopicGate{Topic: ts.Topic, Reason: GateTripped, CooldownTicks: ts.CooldownTicksLeft, Detail: ts.LastError}
}

// BrokerGate is the gate's answer for every topic at once: GateBrokerOpen
// while the broker breaker is open (no topic sends), GateBrokerTrial while it
// is half-open, "" otherwise.
func (s *Sweeper) BrokerGate() GateReason {
	switch s.gate.brokerState() {
	case breaker.DependencyOpen:
		return GateBrokerOpen
	case breaker.DependencyHalfOpen:
		return GateBrokerTrial
	}
	return ""
}
