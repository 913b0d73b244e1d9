// Package metrics exports the sweeper's Prometheus metrics on a registry the
// caller passes in (no global registry). Label cardinality is bounded by the
// topics: never a message or row id. Every label value goes through one helper
// (label) that escapes bytes that are not UTF-8 and bounds the length, since a
// topic is whatever bytes a row, Redis or a request held.
package metrics

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxsql "github.com/outbox-sweeper/sweeper/sql"
)

// Metrics holds the sweeper's metrics. It implements outbox.Observer, and its
// OnTopicChange and OnDependencyChange methods fit the breakers' hooks.
type Metrics struct {
	dispatched      *prometheus.CounterVec
	batches         *prometheus.CounterVec
	errors          *prometheus.CounterVec
	deadLettered    *prometheus.CounterVec
	expired         *prometheus.CounterVec
	alertsDropped   *prometheus.CounterVec
	tripped         *prometheus.GaugeVec
	dependency      prometheus.Gauge
	outstanding     prometheus.Gauge
	oldestAge       prometheus.Gauge
	deadLetters     prometheus.Gauge
	listening       prometheus.Gauge
	sweepDuration   prometheus.Histogram
	dispatchLatency prometheus.Histogram
	batchSize       prometheus.Histogram
	sendDuration    *prometheus.HistogramVec
	retries         *prometheus.CounterVec
	resent          *prometheus.CounterVec
	topicChanges    *prometheus.CounterVec
	brokerChanges   *prometheus.CounterVec
	deadByReason    *prometheus.GaugeVec
	oldestDeadAge   prometheus.Gauge
	buildInfo       *prometheus.GaugeVec
	tableBytes      prometheus.Gauge
	tableDeadRows   prometheus.Gauge
	horizonHeld     prometheus.Gauge
	horizonAge      prometheus.Gauge
	topicsTracked   prometheus.GaugeFunc
	activeTopics    prometheus.GaugeFunc
	topics          *topicLabels
	maxTopics       int
	sweepsFailing   prometheus.Gauge
	refreshed       prometheus.Gauge
	// sessions: the LISTEN sessions' states in a relay of many (Session).
	sessions sessions
}

var (
	_ outbox.ListenObserver        = (*Metrics)(nil)
	_ outbox.SendObserver          = (*Metrics)(nil)
	_ outbox.ExpiryObserver        = (*Metrics)(nil)
	_ outbox.SweepFailuresObserver = (*Metrics)(nil)
	_ outbox.ResendObserver        = (*Metrics)(nil)
)

// The help of the gauges a relay of many exports from all its outboxes
// (RegisterOutboxes) in place of a relay of one's: a registry keeps a name's
// help for good, taken out and put back.
const (
	helpTripped = "1 while the topic's breaker is tripped or half-open, else 0; in a relay of many, the number of outboxes where it is " +
		"(the topics with the most first, the rest counted under topic=\"_other\")."
	helpSweepsFailing = "Sweeps that failed one after another (a database error: down, or a statement that fails every time), " +
		"0 once one succeeds; in a relay of many, the most of any outbox's. Nothing is sent while it rises."
	helpOldestAge = "Age of the oldest outstanding row: the relay's lag (refreshed on a schedule); in a relay of many, the most " +
		"any outbox's sweeps are behind (the age of the oldest row of their last page while rows wait), or the oldest row of an outbox with per-outbox series (in trouble, or named by --metrics-outboxes)."
)

// New registers the metrics on reg, with Config's defaults.
func New(reg prometheus.Registerer) *Metrics { return NewWithConfig(reg, Config{}) }

// NewWithConfig registers the metrics on reg.
func NewWithConfig(reg prometheus.Registerer, cfg Config) *Metrics {
	cfg = cfg.withDefaults()
	m := &Metrics{maxTopics: cfg.MaxTopics,
		sessions: sessions{listening: map[string]bool{}},
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_messages_dispatched_total",
			Help: "Messages the broker accepted."}, []string{"topic"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_batches_total",
			Help: "Batches sent, by result: ok or failed."}, []string{"topic", "result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_dispatch_errors_total",
			Help: "Failed batches by failure class: transient, topic, message, local, broker (connection refused/reset/closed)."}, []string{"topic", "class"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_dead_lettered_total",
			Help: "Rows moved to the dead-letter table (expired ones included)."}, []string{"topic"}),
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_expired_messages_total",
			Help: "Rows that passed their deadline (expires_at, or --max-age / --topic-max-age) before they could be sent, moved to the dead-letter table with reason expired."}, []string{"topic"}),
		alertsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_alerts_dropped_total",
			Help: "Alerts not delivered: queue_full (the receiver failed or was slow while alerts kept coming), undeliverable (tried for 15 minutes) or closed (raised while the sweeper stopped)."}, []string{"why"}),
		tripped: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_topic_tripped",
			Help: helpTripped}, []string{"topic"}),
		dependency: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_dependency_circuit_breaker_state",
			Help: "The broker circuit breaker: 0 closed, 1 open, 2 half-open."}),
		outstanding: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_outstanding_messages",
			Help: "Rows not yet dispatched (refreshed on a schedule)."}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_oldest_outstanding_age_seconds",
			Help: helpOldestAge}),
		deadLetters: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_dead_letter_messages",
			Help: "Rows in the dead-letter table (refreshed on a schedule)."}),
		listening: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_listening",
			Help: "1 while the connection that listens for commits (wake-up on commit) is up, else 0: sweeps then follow the tick only."}),
		sweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_sweep_duration_seconds",
			Help: "Duration of a sweep, a tick's or a wake-up's.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}),
		dispatchLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_dispatch_latency_seconds",
			Help: "Time from the application's write to the broker's acceptance.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outbox_batch_size",
			Help: "Messages per batch the broker accepted.", Buckets: prometheus.ExponentialBuckets(1, 2, 12)}),
		sendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "outbox_send_duration_seconds",
			Help:    "Duration of one call of the broker's send for a batch, by result: ok or failed (each try of a retried send counts).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}, []string{"result"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_send_retries_total",
			Help: "Sends tried again within the same send (--retry-attempts), by the class of the failure retried."}, []string{"topic", "class"}),
		resent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_resent_messages_total",
			Help: "Rows sent again, or left to be, after the broker may have taken them: the duplicates the sweeper knows of, by cause: " +
				"unknown_outcome (a send that failed after it may have delivered them, and named none delivered) or " +
				"rolled_back (their page's transaction rolled back after the broker took them)."}, []string{"topic", "cause"}),
		topicChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_topic_breaker_transitions_total",
			Help: "Changes of a topic breaker's state, by the state entered: tripped, half-open, closed."}, []string{"topic", "to"}),
		brokerChanges: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "outbox_dependency_circuit_breaker_transitions_total",
			Help: "Changes of the broker circuit breaker's state."}, []string{"from", "to"}),
		deadByReason: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_dead_letter_messages_by_reason",
			Help: "Rows in the dead-letter table by reason (refreshed on a schedule)."}, []string{"reason"}),
		oldestDeadAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_oldest_dead_letter_age_seconds",
			Help: "Age of the oldest dead letter, 0 when there is none (refreshed on a schedule)."}),
		sweepsFailing: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_sweeps_failed_consecutive",
			Help: helpSweepsFailing}),
		buildInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "outbox_build_info",
			Help: "1, labelled with the sweeper's version, its Go version and its source revision."}, []string{"version", "goversion", "revision"}),
		tableBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_table_bytes",
			Help: "Size of the outbox table with its indexes and TOAST (refreshed on a schedule)."}),
		tableDeadRows: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_table_dead_rows",
			Help: "Dead row versions in the outbox table, Postgres's estimate: they go when vacuum removes them, which nothing holding the horizon prevents (refreshed on a schedule)."}),
		horizonHeld: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_horizon_held_seconds",
			Help: "How long the transaction that holds the vacuum horizon back the longest has been open, 0 when Postgres does not say (a replication slot; a session of another role without pg_read_all_stats); GET /status names it (refreshed on a schedule)."}),
		refreshed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_metrics_refreshed_timestamp_seconds",
			Help: "When the gauges refreshed on a schedule (backlog, oldest age, dead letters, table health) were last read in full, in Unix seconds; 0 until the first refresh. " +
				"Minutes old: the refresh fails (the log says why, \"metrics refresh failed\") and those gauges hold old values, so OutboxLagHigh cannot see a lag."}),
		horizonAge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "outbox_horizon_xmin_age",
			Help: "How many transactions ago the oldest snapshot that holds the vacuum horizon (a session, replication slot or prepared transaction) began (refreshed on a schedule)."}),
	}
	m.topics = newTopicLabels(cfg, topicVecs{m.dispatched.MetricVec, m.batches.MetricVec, m.errors.MetricVec,
		m.deadLettered.MetricVec, m.expired.MetricVec, m.retries.MetricVec, m.resent.MetricVec, m.topicChanges.MetricVec, m.tripped.MetricVec}.drop)
	m.topicsTracked = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_metrics_topics",
		Help: "Topics with series of their own in the per-topic metrics (at most --metrics-max-topics); the others are counted under topic=\"_other\"."},
		func() float64 { return float64(m.topics.len()) })
	m.activeTopics = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "outbox_active_topics",
		Help: "Distinct topics this sweeper sent, failed, retried, expired or dead-lettered within the last 5 to 10 minutes: an estimate, within a few percent up to about a million. Thousands are almost always an application writing an id as the topic."},
		m.topics.activeTopics)
	reg.MustRegister(m.topicsTracked, m.activeTopics)
	reg.MustRegister(m.dispatched, m.batches, m.errors, m.deadLettered, m.expired, m.alertsDropped, m.tripped, m.dependency, m.outstanding,
		m.oldestAge, m.deadLetters, m.listening, m.sweepDuration, m.dispatchLatency, m.batchSize,
		m.sendDuration, m.retries, m.resent, m.topicChanges, m.brokerChanges, m.deadByReason, m.oldestDeadAge, m.buildInfo,
		m.tableBytes, m.tableDeadRows, m.horizonHeld, m.horizonAge, m.sweepsFailing, m.refreshed)
	return m
}

// SetBuildInfo sets outbox_build_info for this binary's version; the Go
// version and revision come from the build.
func (m *Metrics) SetBuildInfo(version string) {
	goVersion, revision := runtime.Version(), "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	m.buildInfo.Reset()
	m.buildInfo.WithLabelValues(label(version), label(goVersion), label(revision)).Set(1)
}

// BatchSent implements outbox.SendObserver.
func (m *Metrics) BatchSent(_ string, _ int, d time.Duration, err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	m.sendDuration.WithLabelValues(result).Observe(d.Seconds())
}

// SendRetried implements outbox.SendObserver.
func (m *Metrics) SendRetried(topic string, class producer.Class) {
	m.retries.WithLabelValues(m.topics.of(topic), label(class.String())).Inc()
}

// ResentTotal returns the resent-rows counter of topic and cause.
func (m *Metrics) ResentTotal(topic, cause string) prometheus.Counter {
	return m.resent.WithLabelValues(m.labelOf(topic), label(cause))
}

// Resent implements outbox.ResendObserver.
func (m *Metrics) Resent(topic, cause string, n int) {
	m.resent.WithLabelValues(m.topics.of(topic), label(cause)).Add(float64(n))
}

// BatchDispatched implements outbox.Observer.
func (m *Metrics) BatchDispatched(topic string, size int, latencies []time.Duration) {
	l := m.topics.of(topic)
	m.dispatched.WithLabelValues(l).Add(float64(size))
	m.batches.WithLabelValues(l, label("ok")).Inc()
	m.batchSize.Observe(float64(size))
	for _, d := range latencies {
		m.dispatchLatency.Observe(d.Seconds())
	}
}

// BatchFailed implements outbox.Observer.
func (m *Metrics) BatchFailed(topic string, class producer.Class) {
	l := m.topics.of(topic)
	m.batches.WithLabelValues(l, label("failed")).Inc()
	m.errors.WithLabelValues(l, label(class.String())).Inc()
}

// DeadLettered implements outbox.Observer.
func (m *Metrics) DeadLettered(topic string, n int) {
	m.deadLettered.WithLabelValues(m.topics.of(topic)).Add(float64(n))
}

// Expired implements outbox.ExpiryObserver.
func (m *Metrics) Expired(topic string, n int) {
	m.expired.WithLabelValues(m.topics.of(topic)).Add(float64(n))
}

// AlertDropped counts an alert the notifier dropped, and why.
func (m *Metrics) AlertDropped(why string) { m.alertsDropped.WithLabelValues(label(why)).Inc() }

// Listening implements outbox.ListenObserver.
func (m *Metrics) Listening(up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.listening.Set(v)
}

// SweepsFailing implements outbox.SweepFailuresObserver.
func (m *Metrics) SweepsFailing(n int) { m.sweepsFailing.Set(float64(n)) }

// SweepsFailingGauge returns outbox_sweeps_failed_consecutive, for tests.
func (m *Metrics) SweepsFailingGauge() prometheus.Gauge { return m.sweepsFailing }

// SweepDone implements outbox.Observer.
func (m *Metrics) SweepDone(d time.Duration) { m.sweepDuration.Observe(d.Seconds()) }

// OnTopicChange fits breaker.Settings.OnStateChange. A topic without series
// of its own moves the count of tripped topics under topic="_other"; the next
// Refresh sets that count from the breaker's list.
func (m *Metrics) OnTopicChange(topic string, from, to breaker.State, _ string) {
	l := m.topics.of(topic)
	m.topicChanges.WithLabelValues(l, label(to.String())).Inc()
	if l == OtherTopic {
		m.otherTopicChange(from, to)
		return
	}
	v := 0.0
	if to != breaker.StateClosed {
		v = 1
	}
	m.tripped.WithLabelValues(l).Set(v)
}

// otherTopicChange moves the count of tripped topics without series of
// their own (topic="_other") by one topic's change.
func (m *Metrics) otherTopicChange(from, to breaker.State) {
	switch {
	case from == breaker.StateClosed && to != breaker.StateClosed:
		m.tripped.WithLabelValues(OtherTopic).Inc()
	case from != breaker.StateClosed && to == breaker.StateClosed:
		m.tripped.WithLabelValues(OtherTopic).Dec()
	}
}

// OnDependencyChange fits breaker.DependencyConfig.OnStateChange.
func (m *Metrics) OnDependencyChange(from, to breaker.DependencyState, _ string) {
	m.dependency.Set(float64(to))
	m.brokerChanges.WithLabelValues(label(from.String()), label(to.String())).Inc()
}

// Refresh sets the gauges that need a query: outstanding rows, the oldest
// one's age, dead letters; deletes the series of topics idle for TopicIdle (so
// that a sweeper that sees no events still lets them go); and sets
// outbox_topic_tripped from the topic
// breaker's list, so that changes made by other instances (a shared breaker)
// show too. Run it on a schedule, not per scrape.
func (m *Metrics) Refresh(ctx context.Context, pool *pgxpool.Pool, t outbox.Table, topics breaker.Breaker) error {
	m.topics.expire()
	if topics != nil {
		m.setTripped(topics.Tripped())
	}
	t = t.WithDefaults()
	var outstanding, dead int64
	var age float64
	stmt := outboxsql.Statement("metrics_refresh", outboxsql.Tables{
		Outbox: pgx.Identifier{t.Schema, t.Name}.Sanitize(), DeadLetter: pgx.Identifier{t.Schema, t.DeadLetterName()}.Sanitize()})
	err := pool.QueryRow(ctx, stmt).Scan(&outstanding, &age, &dead)
	if err != nil {
		return fmt.Errorf("refresh metrics of %s: %w", t, err)
	}
	m.outstanding.Set(float64(outstanding))
	m.oldestAge.Set(age)
	m.deadLetters.Set(float64(dead))

	rows, err := pool.Query(ctx, outboxsql.Statement("metrics_dead_letters", outboxsql.Tables{
		DeadLetter: pgx.Identifier{t.Schema, t.DeadLetterName()}.Sanitize()}))
	if err != nil {
		return fmt.Errorf("refresh dead-letter metrics of %s: %w", t, err)
	}
	type group struct {
		Reason string
		Count  int64
		Age    float64
	}
	groups, err := pgx.CollectRows(rows, pgx.RowToStructByPos[group])
	if err != nil {
		return fmt.Errorf("refresh dead-letter metrics of %s: %w", t, err)
	}
	m.deadByReason.Reset() // a reason purged away leaves the series
	oldest := 0.0
	for _, g := range groups {
		m.deadByReason.WithLabelValues(label(g.Reason)).Set(float64(g.Count))
		oldest = max(oldest, g.Age)
	}
	m.oldestDeadAge.Set(oldest)

	h, err := outbox.ReadTableHealth(ctx, pool, t)
	if err != nil {
		return err
	}
	m.tableBytes.Set(float64(h.Bytes))
	m.tableDeadRows.Set(float64(h.DeadRows))
	m.horizonHeld.Set(0)
	m.horizonAge.Set(0)
	if h.Horizon != nil {
		if h.Horizon.HeldSeconds != nil {
			m.horizonHeld.Set(*h.Horizon.HeldSeconds)
		}
		m.horizonAge.Set(float64(h.Horizon.XminAge))
	}
	// Only a refresh read in full: a gauge that stopped moving because its
	// query fails looks the same as one whose value holds still, and without
	// this the lag alert went blind without a word (an independent review).
	m.refreshed.SetToCurrentTime()
	return nil
}

// RefreshedGauge returns outbox_metrics_refreshed_timestamp_seconds, for tests.
func (m *Metrics) RefreshedGauge() prometheus.Gauge { return m.refreshed }

// setTripped makes outbox_topic_tripped list exactly the topics of list: at
// most MaxTopics of them by name, those with series of their own first, and
// the number of the rest under topic="_other". The topics are whatever the
// breaker holds, from any instance sharing it, so they are escaped like every
// other label.
func (m *Metrics) setTripped(list []breaker.TopicStatus) {
	m.tripped.Reset()
	own, other := 0, 0
	var rest []string
	for _, st := range list {
		if l, ok := m.topics.known(st.Topic); ok && l != OtherTopic && own < m.maxTopics {
			m.tripped.WithLabelValues(l).Set(1)
			own++
			continue
		}
		rest = append(rest, st.Topic)
	}
	for _, topic := range rest {
		if l := label(topic); own < m.maxTopics && l != OtherTopic {
			m.tripped.WithLabelValues(l).Set(1)
			own++
			continue
		}
		other++
	}
	if other > 0 {
		m.tripped.WithLabelValues(OtherTopic).Set(float64(other))
	}
}

// Dispatched, Errors, Tripped and DeadLetteredTotal return single series, for
// tests. They take the topic as the sweeper reports it, and escape it as the
// observer methods do.
func (m *Metrics) Dispatched(topic string) prometheus.Counter {
	return m.dispatched.WithLabelValues(m.labelOf(topic))
}

func (m *Metrics) Errors(topic, class string) prometheus.Counter {
	return m.errors.WithLabelValues(m.labelOf(topic), label(class))
}

func (m *Metrics) Tripped(topic string) prometheus.Gauge {
	return m.tripped.WithLabelValues(m.labelOf(topic))
}

func (m *Metrics) DeadLetteredTotal(topic string) prometheus.Counter {
	return m.deadLettered.WithLabelValues(m.labelOf(topic))
}

func (m *Metrics) ExpiredTotal(topic string) prometheus.Counter {
	return m.expired.WithLabelValues(m.labelOf(topic))
}

// ListeningGauge returns outbox_listening, for tests.
func (m *Metrics) ListeningGauge() prometheus.Gauge { return m.listening }

// labelOf is topic's label value as the observer methods last gave it: its
// own while it holds a place (or has none yet), else "_other".
func (m *Metrics) labelOf(topic string) string {
	if l, ok := m.topics.known(topic); ok {
		return l
	}
	if m.topics.len() >= m.maxTopics {
		return OtherTopic
	}
	return label(topic)
}
