package metrics_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/metrics"
)

// A relay of many databases listens while every database's session does; a
// database taken off the list no longer counts, nor does a relay with none.
func TestSessionsListenTogether(t *testing.T) {
	t.Parallel()
	m := metrics.New(prometheus.NewRegistry())
	listening := func() float64 { return testutil.ToFloat64(m.ListeningGauge()) }
	db1, db2 := m.Session("db1"), m.Session("db2")
	db1.Listening(true)
	require.Equal(t, 1.0, listening())
	db2.Listening(false)
	require.Equal(t, 0.0, listening(), "one database's session lost")
	db1.Listening(true)
	require.Equal(t, 0.0, listening(), "one session coming back does not hide another's lost")
	db2.Listening(true)
	require.Equal(t, 1.0, listening())
	db2.Listening(false)
	db2.Forget()
	require.Equal(t, 1.0, listening(), "a database taken off the list")
	db1.Forget()
	require.Equal(t, 1.0, listening(), "no database: nothing lost")
}

type states []metrics.OutboxState

func (s states) States() []metrics.OutboxState { return s }
func (states) Backlogs(context.Context, []string) (map[string]metrics.Backlog, error) {
	return map[string]metrics.Backlog{}, nil
}

// withBacklogs is states whose outboxes' backlogs are read from a map.
type withBacklogs struct {
	states
	backlogs map[string]metrics.Backlog
	err      error // beside them: a database did not answer
}

func (w withBacklogs) Backlogs(_ context.Context, names []string) (map[string]metrics.Backlog, error) {
	out := map[string]metrics.Backlog{}
	for _, n := range names {
		if b, ok := w.backlogs[n]; ok {
			out[n] = b
		}
	}
	return out, w.err
}

// In a relay of many, outbox_topic_tripped{topic} counts the outboxes where
// the topic is tripped, and outbox_sweeps_failed_consecutive is the most of
// any outbox's, read from all of them at the scrape (each outbox set them
// over the others' before); the relay of one's own gauges are taken out.
func TestARelayOfManyExportsTheGaugesOfAll(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.ForMany(reg)
	m.OnTopicChange("orders", 0, 1, "") // one outbox's change: not the process's gauge
	metrics.RegisterOutboxes(reg, states{
		{Name: "tenant_a", Tripped: []string{"orders", "mail"}, SweepsFailing: 3},
		{Name: "tenant_b", Tripped: []string{"orders"}, SweepsFailing: 1, Behind: 90 * time.Second},
		{Name: "tenant_c", Behind: 2 * time.Second},
	}, nil, 0)
	want := `
# HELP outbox_sweeps_failed_consecutive Sweeps that failed one after another (a database error: down, or a statement that fails every time), 0 once one succeeds; in a relay of many, the most of any outbox's. Nothing is sent while it rises.
# TYPE outbox_sweeps_failed_consecutive gauge
outbox_sweeps_failed_consecutive 3
# HELP outbox_topic_tripped 1 while the topic's breaker is tripped or half-open, else 0; in a relay of many, the number of outboxes where it is (the topics with the most first, the rest counted under topic="_other").
# TYPE outbox_topic_tripped gauge
outbox_topic_tripped{topic="mail"} 1
outbox_topic_tripped{topic="orders"} 2
# HELP outbox_oldest_outstanding_age_seconds Age of the oldest outstanding row: the relay's lag (refreshed on a schedule); in a relay of many, the most any outbox's sweeps are behind (the age of the oldest row of their last page while rows wait), or the oldest row of an outbox with per-outbox series (in trouble, or named by --metrics-outboxes).
# TYPE outbox_oldest_outstanding_age_seconds gauge
outbox_oldest_outstanding_age_seconds 90
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), "outbox_topic_tripped", "outbox_sweeps_failed_consecutive",
		"outbox_oldest_outstanding_age_seconds"))
	n, err := testutil.GatherAndCount(reg, "outbox_outstanding_messages", "outbox_dead_letter_messages", "outbox_table_bytes",
		"outbox_metrics_refreshed_timestamp_seconds")
	require.NoError(t, err)
	require.Zero(t, n, "the table's gauges, which no relay of many refreshes, and the time of their refresh (0 would fire OutboxMetricsStale)")

	// An outbox with a tripped topic sweeps none of its rows: its oldest
	// row, read at the scrape, is the lag if it is older than any outbox's
	// sweeps are behind.
	oldest := func(age float64) map[string]metrics.Backlog {
		return map[string]metrics.Backlog{"tenant_a": {Rows: 5, OldestAgeSeconds: &age}}
	}
	// Another database's failure to answer does not take tenant_a's away.
	down := errors.New(`database "db2": read the outboxes' backlogs: connection refused`)
	for _, c := range []struct {
		age, want float64
		err       error
	}{{600, 600, nil}, {30, 90, nil}, {600, 600, down}} {
		reg := prometheus.NewRegistry()
		metrics.RegisterOutboxes(reg, withBacklogs{states{
			{Name: "tenant_a", Tripped: []string{"orders"}},
			{Name: "tenant_b", Behind: 90 * time.Second},
			{Name: "db2_tenant", SweepsFailing: 4},
		}, oldest(c.age), c.err}, nil, 0)
		mf, err := reg.Gather()
		require.NoError(t, err)
		got := -1.0
		for _, f := range mf {
			if f.GetName() == "outbox_oldest_outstanding_age_seconds" {
				got = f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		require.Equal(t, c.want, got, "the tripped outbox's oldest row %v s old", c.age)
	}

	// --metrics-max-topics bounds the topics by name: the most tripped
	// first, the rest under _other.
	capped := prometheus.NewRegistry()
	metrics.RegisterOutboxes(capped, states{
		{Name: "tenant_a", Tripped: []string{"orders", "mail", "sms"}},
		{Name: "tenant_b", Tripped: []string{"orders"}},
	}, nil, 1)
	want = `
# HELP outbox_topic_tripped 1 while the topic's breaker is tripped or half-open, else 0; in a relay of many, the number of outboxes where it is (the topics with the most first, the rest counted under topic="_other").
# TYPE outbox_topic_tripped gauge
outbox_topic_tripped{topic="_other"} 2
outbox_topic_tripped{topic="orders"} 2
`
	require.NoError(t, testutil.GatherAndCompare(capped, strings.NewReader(want), "outbox_topic_tripped"))
}

// countedBacklogs counts its reads of the backlogs.
type countedBacklogs struct {
	withBacklogs
	reads *atomic.Int32
}

func (c countedBacklogs) Backlogs(ctx context.Context, names []string) (map[string]metrics.Backlog, error) {
	c.reads.Add(1)
	return c.withBacklogs.Backlogs(ctx, names)
}

// Scrapes close together share one read of the backlogs, one whose database
// does not answer too: /metrics needs no token, and each scrape read the
// databases (and waited out the timeout of one down, one scrape after the
// other).
func TestScrapesCloseTogetherShareOneReadOfTheBacklogs(t *testing.T) {
	t.Parallel()
	var reads atomic.Int32
	src := countedBacklogs{withBacklogs: withBacklogs{states: states{{Name: "a", Tripped: []string{"orders"}}, {Name: "down", SweepsFailing: 3}},
		backlogs: map[string]metrics.Backlog{"a": {Rows: 3}}, err: errors.New("database down: not read")}, reads: &reads}
	reg := prometheus.NewRegistry()
	metrics.RegisterOutboxes(reg, src, nil, 0)
	start := time.Now()
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			got, err := reg.Gather()
			require.NoError(t, err)
			require.NotEmpty(t, got)
		})
	}
	wg.Wait()
	// One read a window of two seconds: the twenty scrapes fall in one on
	// any machine but a stalled one.
	windows := 1 + int32(time.Since(start)/(2*time.Second))
	require.Positive(t, reads.Load())
	require.LessOrEqual(t, reads.Load(), windows, "twenty scrapes, %d reads", reads.Load())
}
