package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// sessions holds the state of each LISTEN session of a relay of many (one a
// database), once reported: outbox_listening is 1 while every one listens.
// Each set the gauge over the others' before, so that one database's session
// coming back hid another's lost.
type sessions struct {
	mu        sync.Mutex
	listening map[string]bool
}

// Session is what one database's LISTEN session of a relay of many tells
// the metrics (fleet.SessionObserver), named by name: outbox_listening is 1
// while every session reported listens. Sessions of one name share their
// state; Forget drops it.
type Session struct {
	m    *Metrics
	name string
}

// Session returns what the session named name tells m.
func (m *Metrics) Session(name string) *Session { return &Session{m: m, name: name} }

// Listening implements outbox.ListenObserver.
func (s *Session) Listening(up bool) {
	m := s.m
	m.sessions.mu.Lock()
	defer m.sessions.mu.Unlock()
	m.sessions.listening[s.name] = up
	m.setListening()
}

// Forget drops what the session reported: a database taken off the list no
// longer counts, its lost session held by no one.
func (s *Session) Forget() {
	m := s.m
	m.sessions.mu.Lock()
	defer m.sessions.mu.Unlock()
	if _, ok := m.sessions.listening[s.name]; ok {
		delete(m.sessions.listening, s.name)
		m.setListening()
	}
}

// setListening sets outbox_listening to 1 while every session reported
// listens, and while none is (every database taken off the list: nothing
// is lost); m.sessions.mu is held.
func (m *Metrics) setListening() {
	up := true
	for _, l := range m.sessions.listening {
		up = up && l
	}
	v := 0.0
	if up {
		v = 1
	}
	m.listening.Set(v)
}

// ForMany unregisters from reg the gauges a relay of one outbox sets, which
// in a relay of many would say one outbox's state as the process's: those
// it refreshes from its table (Refresh) and the time of that refresh, which
// a relay of many never refreshes (they would read 0 for good, no lag and no
// dead letters, whatever the tenants hold, and OutboxMetricsStale firing for
// good; a relay of many says those per tenant), and
// outbox_topic_tripped and outbox_sweeps_failed_consecutive, which every
// outbox would set over the others'. RegisterOutboxes exports those two,
// and the lag, read from all.
func (m *Metrics) ForMany(reg prometheus.Registerer) {
	for _, c := range []prometheus.Collector{m.outstanding, m.oldestAge, m.deadLetters, m.deadByReason, m.oldestDeadAge,
		m.tableBytes, m.tableDeadRows, m.horizonHeld, m.horizonAge, m.tripped, m.sweepsFailing, m.refreshed} {
		reg.Unregister(c)
	}
}
