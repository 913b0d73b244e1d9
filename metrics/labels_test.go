package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/producer"
)

// gatheredLabels gathers reg and returns, per metric name, the label values
// of each series (topic, and class or result where the metric has them),
// failing t on a value a scraper could not read.
func gatheredLabels(t *testing.T, reg *prometheus.Registry) map[string][]map[string]string {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string][]map[string]string{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				require.True(t, utf8.ValidString(l.GetValue()), "%s{%s=%q} is not valid UTF-8", f.GetName(), l.GetName(), l.GetValue())
				require.LessOrEqual(t, len(l.GetValue()), metrics.MaxLabelBytes, "%s{%s} is %d bytes", f.GetName(), l.GetName(), len(l.GetValue()))
				labels[l.GetName()] = l.GetValue()
			}
			out[f.GetName()] = append(out[f.GetName()], labels)
		}
	}
	return out
}

// A topic that is not valid UTF-8 used to panic client_golang in
// WithLabelValues, which took the process down (exit 2) on the first batch of
// such a row in a SQL_ASCII database. It is now exported with its bad bytes
// escaped, and the valid text around them kept.
func TestATopicThatIsNotUTF8IsExportedWithItsBytesEscaped(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	require.NotPanics(t, func() {
		m.BatchDispatched("orders\xff\xfe", 2, []time.Duration{time.Millisecond})
		m.BatchFailed("orders\xff\xfe", producer.ClassBroker)
		m.DeadLettered("orders\xff\xfe", 1)
		m.OnTopicChange("orders\xff\xfe", breaker.StateClosed, breaker.StateTripped, "bad\xffreason")
		m.BatchDispatched("orders\xfe", 1, nil)
	})
	got := gatheredLabels(t, reg)
	require.Contains(t, got["outbox_messages_dispatched_total"], map[string]string{"topic": `orders\xff\xfe`})
	require.Contains(t, got["outbox_messages_dispatched_total"], map[string]string{"topic": `orders\xfe`},
		"two topics that differ in their bad bytes stay two series")
	require.Contains(t, got["outbox_dispatch_errors_total"], map[string]string{"topic": `orders\xff\xfe`, "class": "broker"})
	require.Contains(t, got["outbox_batches_total"], map[string]string{"topic": `orders\xff\xfe`, "result": "failed"})
	require.Contains(t, got["outbox_dead_lettered_total"], map[string]string{"topic": `orders\xff\xfe`})
	require.Contains(t, got["outbox_topic_tripped"], map[string]string{"topic": `orders\xff\xfe`})
	require.Equal(t, 2.0, testutil.ToFloat64(m.Dispatched("orders\xff\xfe")), "the accessors take the topic as the sweeper reports it")

	// A valid topic, even one with a backslash or U+FFFD, is exported as is.
	m.BatchDispatched(`a\b`+"\uFFFD", 1, nil)
	require.Contains(t, gatheredLabels(t, reg)["outbox_messages_dispatched_total"], map[string]string{"topic": `a\b` + "\uFFFD"})
}

// A 10,000-byte topic would have been a 10 KB label on every series of it, in
// the registry and on each scrape. It is cut to MaxLabelBytes with a hash of
// the whole topic, so two long topics that begin alike stay apart, and the
// same long topic always lands on the same series.
func TestAnOverlongTopicIsCutWithAHashThatKeepsTopicsApart(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	long1 := strings.Repeat("é", 5000) + "1" // 10,001 bytes, two-byte characters
	long2 := strings.Repeat("é", 5000) + "2"
	longBad := strings.Repeat("\xff", 300) // 1,200 bytes once escaped
	for range 2 {
		m.BatchDispatched(long1, 1, nil)
	}
	m.BatchDispatched(long2, 1, nil)
	m.BatchDispatched(longBad, 1, nil)

	series := gatheredLabels(t, reg)["outbox_messages_dispatched_total"]
	require.Len(t, series, 3)
	seen := map[string]bool{}
	for _, s := range series {
		topic := s["topic"]
		seen[topic] = true
		require.Contains(t, topic, "…", "a cut label shows it was cut")
		require.LessOrEqual(t, len(topic), metrics.MaxLabelBytes)
		require.Greater(t, len(topic), metrics.MaxLabelBytes-8, "the cut keeps as much of the topic as fits")
	}
	require.Len(t, seen, 3, "three long topics, three series")
	require.Equal(t, 2.0, testutil.ToFloat64(m.Dispatched(long1)), "the same long topic lands on the same series")
	require.Equal(t, 1.0, testutil.ToFloat64(m.Dispatched(long2)))
	for _, s := range series {
		if strings.HasPrefix(s["topic"], `\xff`) {
			require.Regexp(t, `^(\\xff)+…[0-9a-f]{16}$`, s["topic"], "the cut never splits an escape")
		} else {
			require.Regexp(t, `^(é)+…[0-9a-f]{16}$`, s["topic"], "the cut never splits a character")
		}
	}

	// A topic of exactly MaxLabelBytes is kept whole.
	exact := strings.Repeat("a", metrics.MaxLabelBytes)
	m.BatchDispatched(exact, 1, nil)
	require.Contains(t, gatheredLabels(t, reg)["outbox_messages_dispatched_total"], map[string]string{"topic": exact})
}

// Refresh reads outbox_topic_tripped from the breaker's list, which holds
// whatever another instance or an operator put there. A topic that is not
// valid UTF-8 there used to panic the refresh, within 15 s of start, on every
// start while it stayed tripped.
func TestRefreshExportsATrippedTopicThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	topics := breaker.New(breaker.Settings{OnStateChange: m.OnTopicChange})
	topics.Trip("\xff\xfe", "tripped by hand")
	topics.Trip(strings.Repeat("t", 10_000), "tripped by hand")
	require.NotPanics(t, func() {
		require.NoError(t, m.Refresh(context.Background(), dbtest.Pool(t), tbl, topics))
	})
	got := gatheredLabels(t, reg)["outbox_topic_tripped"]
	require.Len(t, got, 2)
	require.Contains(t, got, map[string]string{"topic": `\xff\xfe`})
	require.Equal(t, 1.0, testutil.ToFloat64(m.Tripped("\xff\xfe")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.Tripped(strings.Repeat("t", 10_000))))
}

// The same over a Redis-shared breaker whose state holds such a topic, written
// by hand: every instance sharing that Redis used to crash on this refresh, on
// every start, until someone deleted the key.
func TestRefreshOverARedisHoldingATopicThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	client := brokertest.RedisClient(t, brokertest.RedisURL(t))
	prefix := brokertest.Name("outbox-metrics-test")
	t.Cleanup(func() { client.Del(context.Background(), prefix+":topics") })
	require.NoError(t, client.HSet(ctx, prefix+":topics", "\xff\xfe",
		`{"state":"tripped","ticks_left":10,"cooldown":10,"trips":1,"tripped_at":0,"last_error":"written by hand"}`).Err())
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	topics, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: prefix,
		Settings: breaker.Settings{OnStateChange: m.OnTopicChange}})
	require.NoError(t, err)
	require.NotPanics(t, func() {
		require.NoError(t, m.Refresh(ctx, dbtest.Pool(t), tbl, topics))
	})
	require.Contains(t, gatheredLabels(t, reg)["outbox_topic_tripped"], map[string]string{"topic": `\xff\xfe`})
	require.False(t, topics.Degraded())
}
