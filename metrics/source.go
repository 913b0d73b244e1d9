package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-sweeper/sweeper/breaker"
)

// sources holds what the sources of a relay of many (its outboxes, and its
// databases' LISTEN sessions) report of the gauges they share: each would
// otherwise set the gauge over the others', so that one tenant's topic
// closing cleared another's trip, and one tenant's good sweep hid another's
// failing ones.
type sources struct {
	mu sync.Mutex
	// tripped holds, per topic label (not OtherTopic, already a count), the
	// sources where it is tripped or half-open.
	tripped map[string]map[string]struct{}
	// failing holds each source's sweeps failed in a row, when more than 0.
	failing map[string]int
	// listening holds each LISTEN session's state, once reported.
	listening map[string]bool
}

// Source is m as one source of a relay of many sees it: an outbox (its
// sweeper's Observer, its topic breaker's OnTopicChange) or a database's
// LISTEN session, named by name. The gauges they share are set from all
// sources together: outbox_topic_tripped{topic} counts the outboxes where
// the topic is tripped, outbox_sweeps_failed_consecutive is the most of any
// outbox's, outbox_listening is 1 while every session listens. Every other
// method is m's. Sources of one name share their state; Forget drops it.
type Source struct {
	*Metrics
	name string
}

// Source returns m as the source named name sees it.
func (m *Metrics) Source(name string) *Source { return &Source{Metrics: m, name: name} }

// OnTopicChange fits breaker.Settings.OnStateChange.
func (s *Source) OnTopicChange(topic string, from, to breaker.State, _ string) {
	m := s.Metrics
	l := m.topics.of(topic)
	m.topicChanges.WithLabelValues(l, label(to.String())).Inc()
	if l == OtherTopic {
		m.otherTopicChange(from, to)
		return
	}
	m.sources.mu.Lock()
	defer m.sources.mu.Unlock()
	in := m.sources.tripped[l]
	if to != breaker.StateClosed {
		if in == nil {
			in = map[string]struct{}{}
			m.sources.tripped[l] = in
		}
		in[s.name] = struct{}{}
	} else {
		delete(in, s.name)
		if len(in) == 0 {
			delete(m.sources.tripped, l)
		}
	}
	m.tripped.WithLabelValues(l).Set(float64(len(in)))
}

// SweepsFailing implements outbox.SweepFailuresObserver.
func (s *Source) SweepsFailing(n int) {
	m := s.Metrics
	m.sources.mu.Lock()
	defer m.sources.mu.Unlock()
	if n > 0 {
		m.sources.failing[s.name] = n
	} else {
		delete(m.sources.failing, s.name)
	}
	m.setFailing()
}

// Listening implements outbox.ListenObserver.
func (s *Source) Listening(up bool) {
	m := s.Metrics
	m.sources.mu.Lock()
	defer m.sources.mu.Unlock()
	m.sources.listening[s.name] = up
	m.setListening()
}

// Forget drops what the source reported: an outbox let go (its schema
// dropped) or a database taken off the list no longer counts in the gauges
// it shared, its trips, failures or lost session held by no one.
func (s *Source) Forget() {
	m := s.Metrics
	m.sources.mu.Lock()
	defer m.sources.mu.Unlock()
	for l, in := range m.sources.tripped {
		if _, ok := in[s.name]; ok {
			delete(in, s.name)
			if len(in) == 0 {
				delete(m.sources.tripped, l)
			}
			m.tripped.WithLabelValues(l).Set(float64(len(in)))
		}
	}
	delete(m.sources.failing, s.name)
	m.setFailing()
	if _, ok := m.sources.listening[s.name]; ok {
		delete(m.sources.listening, s.name)
		m.setListening()
	}
}

// setFailing sets outbox_sweeps_failed_consecutive to the most of any
// source's; m.sources.mu is held.
func (m *Metrics) setFailing() {
	most := 0
	for _, n := range m.sources.failing {
		most = max(most, n)
	}
	m.sweepsFailing.Set(float64(most))
}

// setListening sets outbox_listening to 1 while every session reported
// listens; m.sources.mu is held.
func (m *Metrics) setListening() {
	up := len(m.sources.listening) > 0
	for _, l := range m.sources.listening {
		up = up && l
	}
	v := 0.0
	if up {
		v = 1
	}
	m.listening.Set(v)
}

// ForMany unregisters from reg the gauges a relay of one outbox refreshes
// from its table (Refresh), which a relay of many never refreshes: exported,
// they would read 0 for good, no lag and no dead letters, whatever the
// tenants hold. A relay of many says those per tenant (RegisterOutboxes,
// GET /outboxes).
func (m *Metrics) ForMany(reg prometheus.Registerer) {
	for _, c := range []prometheus.Collector{m.outstanding, m.oldestAge, m.deadLetters, m.deadByReason, m.oldestDeadAge,
		m.tableBytes, m.tableDeadRows, m.horizonHeld, m.horizonAge} {
		reg.Unregister(c)
	}
}
