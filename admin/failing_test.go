package admin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// Sweeps that fail one after another while the database answers (here every
// claim fails: a column it reads is gone) make GET /status say degraded with
// the last error, and raise outbox_sweeps_failed_consecutive; /healthz stays
// ok (a restart cures no such fault). Once a sweep succeeds again, both clear.
func TestFailingSweepsMakeStatusDegradedAndRaiseTheMetric(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, dbtest.Pool(t), outbox.Message{Topic: "orders", Payload: []byte("x")}))
	_, err = dbtest.Pool(t).Exec(ctx, "ALTER TABLE "+tbl.Ident()+" RENAME COLUMN partition_key TO pk")
	require.NoError(t, err)

	m := metrics.New(prometheus.NewRegistry())
	s, err := outbox.NewSweeper(dbtest.Pool(t), memory.New(memory.Config{}), outbox.Config{Table: tbl, Tick: 20 * time.Millisecond,
		DisableNotify: true, Observer: m})
	require.NoError(t, err)
	srv := httptest.NewServer(admin.Handler(admin.Config{Pool: dbtest.Pool(t), Table: tbl, Topics: s.TopicBreaker(),
		StatusCacheFor: time.Nanosecond, SweepsFailing: s.Failing,
		// A clock past the stall floor: the backoffs between the failing
		// sweeps would count were they counted (see the dead database's test).
		Stalled: func(now time.Time) (outbox.Stall, bool) {
			return s.Stalled(now.Add(outbox.StallFloor(outbox.SendTimeoutDefault)+time.Second), 3)
		}}))
	defer srv.Close()
	get := func(path string) (int, map[string]any) {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, body
	}
	health := func() (string, string) {
		code, body := get("/status")
		require.Equal(t, http.StatusOK, code, "%v", body)
		h := body["health"].(map[string]any)
		var reasons []string
		for _, r := range h["reasons"].([]any) {
			reasons = append(reasons, r.(string))
		}
		return h["status"].(string), strings.Join(reasons, "; ")
	}

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	defer func() { stop(); <-ran }()

	var reasons string
	dbtest.Eventually(t, time.Minute, "/status says degraded", func() bool {
		var status string
		status, reasons = health()
		return status == "degraded"
	})
	require.Contains(t, reasons, "sweeps in a row failed since")
	require.Contains(t, reasons, "partition_key", "the last error")
	require.GreaterOrEqual(t, testutil.ToFloat64(m.SweepsFailingGauge()), float64(admin.DegradedSweepFailures))
	requireHealthyBetweenSweeps(t, srv.URL) // a restart cures no failing statement

	_, err = dbtest.Pool(t).Exec(ctx, "ALTER TABLE "+tbl.Ident()+" RENAME COLUMN pk TO partition_key")
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "/status is ok again once a sweep succeeds", func() bool {
		status, _ := health()
		return status == "ok"
	})
	require.Zero(t, testutil.ToFloat64(m.SweepsFailingGauge()))
	_, failing := s.Failing()
	require.False(t, failing)
}
