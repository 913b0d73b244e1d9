package metrics_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/metrics"
)

// The outboxes of a relay of many share the process's gauges: a topic
// closing in one tenant leaves it counted as tripped while another tenant's
// is; one tenant's good sweep does not hide another's failing ones; the
// relay listens only while every database's session does. A source let go
// stops counting. (Each source set the gauges over the others' before.)
func TestSourcesShareTheGaugesTheyAllSet(t *testing.T) {
	t.Parallel()
	m := metrics.New(prometheus.NewRegistry())
	a, b := m.Source("tenant_a"), m.Source("tenant_b")
	tripped := func() float64 { return testutil.ToFloat64(m.Tripped("orders")) }

	a.OnTopicChange("orders", breaker.StateClosed, breaker.StateTripped, "")
	b.OnTopicChange("orders", breaker.StateClosed, breaker.StateTripped, "")
	require.Equal(t, 2.0, tripped(), "tripped in two outboxes")
	b.OnTopicChange("orders", breaker.StateTripped, breaker.StateHalfOpen, "")
	require.Equal(t, 2.0, tripped(), "half-open counts as tripped")
	b.OnTopicChange("orders", breaker.StateHalfOpen, breaker.StateClosed, "")
	require.Equal(t, 1.0, tripped(), "b's closing leaves a's trip")
	a.OnTopicChange("orders", breaker.StateTripped, breaker.StateClosed, "")
	require.Equal(t, 0.0, tripped())

	failing := func() float64 { return testutil.ToFloat64(m.SweepsFailingGauge()) }
	a.SweepsFailing(3)
	b.SweepsFailing(1)
	b.SweepsFailing(0)
	require.Equal(t, 3.0, failing(), "b's good sweep does not hide a's failing ones")
	b.SweepsFailing(5)
	require.Equal(t, 5.0, failing())
	b.SweepsFailing(0)
	a.SweepsFailing(0)
	require.Equal(t, 0.0, failing())

	listening := func() float64 { return testutil.ToFloat64(m.ListeningGauge()) }
	db1, db2 := m.Source("db1"), m.Source("db2")
	db1.Listening(true)
	require.Equal(t, 1.0, listening())
	db2.Listening(false)
	require.Equal(t, 0.0, listening(), "one database's session lost")
	db2.Listening(true)
	require.Equal(t, 1.0, listening())

	// A dropped tenant's trip and failures, a database's lost session taken
	// off the list: forgotten.
	a.OnTopicChange("orders", breaker.StateClosed, breaker.StateTripped, "")
	a.SweepsFailing(4)
	db2.Listening(false)
	a.Forget()
	db2.Forget()
	require.Equal(t, 0.0, tripped())
	require.Equal(t, 0.0, failing())
	require.Equal(t, 1.0, listening())
}
