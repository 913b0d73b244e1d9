package metrics_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/producer"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// series counts the series of every family on reg whose name starts with
// outbox_, and the label values of topic seen.
func series(t *testing.T, reg *prometheus.Registry) (n int, topics map[string]bool) {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	topics = map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			n++
			for _, l := range m.GetLabel() {
				if l.GetName() == "topic" {
					topics[l.GetValue()] = true
				}
			}
		}
	}
	return n, topics
}

// A topic per event (an application writing an id as the topic) grows the
// series by none once MaxTopics topics have theirs: the rest are counted under
// _other, and nothing is lost from the totals.
func TestSeriesStayBoundedWhateverTheTopics(t *testing.T) {
	t.Parallel()
	clk := &clock{now: time.Unix(1_000_000, 0)}
	reg := prometheus.NewRegistry()
	const maxTopics = 10
	m := metrics.NewWithConfig(reg, metrics.Config{MaxTopics: maxTopics, TopicIdle: 10 * time.Minute, Now: clk.Now})
	const n = 5000
	for i := range n {
		topic := fmt.Sprintf("t-%d", i)
		m.BatchDispatched(topic, 2, []time.Duration{time.Millisecond})
		m.BatchFailed(topic, producer.ClassTopic)
		m.SendRetried(topic, producer.ClassTransient)
		m.DeadLettered(topic, 1)
		m.Expired(topic, 1)
		m.OnTopicChange(topic, breaker.StateClosed, breaker.StateTripped, "x")
	}
	got, topics := series(t, reg)
	require.LessOrEqual(t, len(topics), maxTopics+1, "topics with series")
	require.True(t, topics[metrics.OtherTopic])
	// 8 per-topic series for each of maxTopics+1 label values, and the rest.
	require.Less(t, got, 9*(maxTopics+1)+80)
	require.Equal(t, float64(2*n), sumOf(t, reg, "outbox_messages_dispatched_total"))
	require.Equal(t, float64(n), sumOf(t, reg, "outbox_dead_lettered_total"))
	require.Equal(t, float64(n), sumOf(t, reg, "outbox_topic_tripped"), "every tripped topic counted, own or under _other")
	require.InDelta(t, float64(n), sumOf(t, reg, "outbox_active_topics"), n*0.05)

	// A topic seen at every sweep wins a place once a one-off topic has not
	// been seen for a minute, and keeps it.
	clk.Add(2 * time.Minute)
	m.BatchDispatched("busy", 1, nil)
	require.Equal(t, float64(1), testutil.ToFloat64(m.Dispatched("busy")))
	for i := range 100 {
		m.BatchDispatched(fmt.Sprintf("u-%d", i), 1, nil)
		m.BatchDispatched("busy", 1, nil)
	}
	_, topics = series(t, reg)
	require.True(t, topics["busy"])
	require.Equal(t, float64(101), testutil.ToFloat64(m.Dispatched("busy")))

	// Idle topics' series go.
	clk.Add(11 * time.Minute)
	metrics.ExpireTopics(m)
	_, topics = series(t, reg)
	require.LessOrEqual(t, len(topics), 1, "only _other's series may stay: %v", topics)
	require.Equal(t, float64(0), sumOf(t, reg, "outbox_metrics_topics"))
}

func sumOf(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetCounter() != nil {
				sum += m.GetCounter().GetValue()
			} else {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
