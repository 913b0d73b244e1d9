package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// After a run with a failing topic and a dead letter, the metrics hold the
// expected numbers.
func TestMetricsAfterARunWithAFailingTopicAndADeadLetter(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	var msgs []outbox.Message
	for range 5 {
		msgs = append(msgs, outbox.Message{Topic: "good", Payload: []byte("x")})
	}
	msgs = append(msgs, outbox.Message{Topic: "bad", Payload: []byte("y")}, outbox.Message{Topic: "poison", Payload: []byte("z")})
	require.NoError(t, w.Write(ctx, dbtest.Pool(t), msgs...))

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	m.SetBuildInfo("v1.2.3-test")
	metrics.RegisterPool(reg, dbtest.Pool(t))
	prod := memory.New(memory.Config{})
	prod.FailNextCalls(1, producer.NewTransientError("busy", errors.New("server busy"))) // one send is tried again
	prod.FailTopic("bad", producer.NewTopicError("not_found", errors.New("no entity")))
	prod.FailMessage(7, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("413")))
	topics := breaker.New(breaker.Settings{OnStateChange: m.OnTopicChange})
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl, Observer: m, TopicBreaker: topics})
	require.NoError(t, err)
	_, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Refresh(ctx, dbtest.Pool(t), tbl, topics))
	m.OnDependencyChange(breaker.DependencyClosed, breaker.DependencyOpen, "5 failures in a row")
	m.OnDependencyChange(breaker.DependencyOpen, breaker.DependencyHalfOpen, "open duration over")
	m.OnDependencyChange(breaker.DependencyHalfOpen, breaker.DependencyClosed, "trial succeeded")

	require.Equal(t, 5.0, testutil.ToFloat64(m.Dispatched("good")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.Errors("bad", "topic")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.Errors("poison", "message")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.Tripped("bad")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.DeadLetteredTotal("poison")))

	// The exposition format, scraped over HTTP and parsed, as Prometheus sees it.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	values := map[string]float64{}
	for name, f := range families {
		for _, metric := range f.GetMetric() {
			key := name
			for _, l := range metric.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case metric.Counter != nil:
				values[key] = metric.GetCounter().GetValue()
			case metric.Gauge != nil:
				values[key] = metric.GetGauge().GetValue()
			case metric.Histogram != nil:
				values[key+",count"] = float64(metric.GetHistogram().GetSampleCount())
			}
		}
	}
	for _, key := range []string{"outbox_messages_dispatched_total,topic=good", "outbox_batches_total,result=ok,topic=good",
		"outbox_batches_total,result=failed,topic=bad", "outbox_topic_tripped,topic=bad", "outbox_outstanding_messages",
		"outbox_dead_letter_messages", "outbox_oldest_outstanding_age_seconds", "outbox_dispatch_latency_seconds,count",
		"outbox_batch_size,count", "outbox_dependency_circuit_breaker_state"} {
		require.Contains(t, values, key, "series %s is exported", key)
	}
	require.Equal(t, 0.0, values["outbox_dependency_circuit_breaker_state"])
	require.Equal(t, 5.0, values["outbox_messages_dispatched_total,topic=good"])
	require.Equal(t, 1.0, values["outbox_batches_total,result=ok,topic=good"])
	require.Equal(t, 1.0, values["outbox_batches_total,result=failed,topic=bad"])
	require.Equal(t, 1.0, values["outbox_topic_tripped,topic=bad"])
	require.Equal(t, 1.0, values["outbox_outstanding_messages"], "bad's row waits")
	require.Equal(t, 1.0, values["outbox_dead_letter_messages"])
	require.Greater(t, values["outbox_oldest_outstanding_age_seconds"], 0.0)
	require.Equal(t, 5.0, values["outbox_dispatch_latency_seconds,count"])
	require.Equal(t, 1.0, values["outbox_batch_size,count"])

	// What an SRE reaches for: the build, each call of the broker, retries,
	// breaker transitions, dead letters by reason and their age, the pool.
	require.Equal(t, 1.0, values["outbox_build_info,goversion="+runtime.Version()+",revision="+revision()+",version=v1.2.3-test"], "%v", keysOf(values, "outbox_build_info"))
	require.Equal(t, float64(len(prod.Accepted())), values["outbox_send_duration_seconds,result=ok,count"], "one observation a call")
	require.Equal(t, float64(prod.Calls()), values["outbox_send_duration_seconds,result=ok,count"]+values["outbox_send_duration_seconds,result=failed,count"])
	retries := 0.0
	for k, v := range values {
		if strings.HasPrefix(k, "outbox_send_retries_total,") {
			require.Contains(t, k, "class=transient")
			retries += v
		}
	}
	require.Equal(t, 1.0, retries, "the one transient failure was tried again")
	require.Equal(t, 1.0, values["outbox_topic_breaker_transitions_total,to=tripped,topic=bad"])
	require.Equal(t, 1.0, values["outbox_dependency_circuit_breaker_transitions_total,from=closed,to=open"])
	require.Equal(t, 1.0, values["outbox_dead_letter_messages_by_reason,reason=message_too_large"])
	require.Contains(t, values, "outbox_oldest_dead_letter_age_seconds")
	require.GreaterOrEqual(t, values["outbox_oldest_dead_letter_age_seconds"], 0.0)
	require.Equal(t, float64(dbtest.Pool(t).Stat().MaxConns()), values["outbox_db_pool_max_connections"])
	require.Greater(t, values["outbox_db_pool_acquires_total"], 0.0)
	require.Contains(t, values, "outbox_db_pool_acquire_wait_seconds_total")
}

func keysOf(values map[string]float64, prefix string) []string {
	var out []string
	for k := range values {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// outbox_listening follows the sweeper's listen connection: 1 once it listens,
// 0 when Postgres ends it, 1 again once it is back.
func TestListeningGaugeFollowsTheListenConnection(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	m := metrics.New(prometheus.NewRegistry())
	app := "metrics-listen-" + tbl.Schema
	s, err := outbox.NewSweeper(dbtest.NamedPool(t, app), memory.New(memory.Config{}), outbox.Config{Table: tbl, Observer: m, Tick: time.Hour})
	require.NoError(t, err)
	stop := dbtest.RunSweeper(t, s)
	defer stop()

	gauge := func() float64 { return testutil.ToFloat64(m.ListeningGauge()) }
	dbtest.Eventually(t, time.Minute, "listening", func() bool { return gauge() == 1 })
	// Held down while terminated: the listener reconnects on its backoff, so
	// keep ending every new connection until the gauge has shown 0.
	dbtest.Eventually(t, time.Minute, "the gauge at 0", func() bool {
		_, err := dbtest.Pool(t).Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name = $1 AND query = 'LISTEN '||$2`, app, outbox.NotifyChannel)
		require.NoError(t, err)
		return gauge() == 0
	})
	dbtest.Eventually(t, time.Minute, "listening again", func() bool { return gauge() == 1 })
}

// An expired row counts in outbox_expired_messages_total and, as the dead
// letter it becomes, in outbox_dead_lettered_total.
func TestExpiredRowsAreCounted(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, dbtest.Pool(t), outbox.Message{Topic: "late", ExpiresAt: time.Now().Add(-time.Minute)},
		outbox.Message{Topic: "late"}))
	m := metrics.New(prometheus.NewRegistry())
	s, err := outbox.NewSweeper(dbtest.Pool(t), memory.New(memory.Config{}), outbox.Config{Table: tbl, Observer: m})
	require.NoError(t, err)
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Dispatched)
	require.Equal(t, 1.0, testutil.ToFloat64(m.ExpiredTotal("late")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.DeadLetteredTotal("late")))
	require.Equal(t, 1.0, testutil.ToFloat64(m.Dispatched("late")))
}

// The duplicates the sweeper knows of are counted by cause: a send that
// failed after it may have delivered its rows, then sent again (in the call,
// or as halves); rows the broker took whose page rolled back; and none for
// a refusal, which delivered nothing.
func TestResentRowsAreCountedByCause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	sweep := func(t *testing.T, tbl outbox.Table, prod *memory.Producer, retries int) *metrics.Metrics {
		m := metrics.New(prometheus.NewRegistry())
		s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl, Observer: m,
			Retry: breaker.Retry{Attempts: retries, Initial: time.Millisecond, Max: time.Millisecond}})
		require.NoError(t, err)
		_, err = s.Sweep(ctx)
		require.NoError(t, err)
		return m
	}
	write := func(t *testing.T, tbl outbox.Table, topic string, n int) {
		w, err := outbox.NewWriter(tbl)
		require.NoError(t, err)
		var msgs []outbox.Message
		for range n {
			msgs = append(msgs, outbox.Message{Topic: topic, Payload: []byte("x")})
		}
		require.NoError(t, w.Write(ctx, dbtest.Pool(t), msgs...))
	}
	for _, tries := range []int{2, 1} { // sent again in the call; as halves
		t.Run(fmt.Sprintf("unknown outcome, tries=%d", tries), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			write(t, tbl, "a", 4)
			prod := memory.New(memory.Config{})
			prod.FailNextCalls(1, producer.NewTransientError("timeout", errors.New("no answer")))
			m := sweep(t, tbl, prod, tries)
			require.Equal(t, 4.0, testutil.ToFloat64(m.ResentTotal("a", outbox.ResendUnknownOutcome)))
			require.Equal(t, 4.0, testutil.ToFloat64(m.Dispatched("a")))
		})
	}
	t.Run("a refusal sends nothing twice", func(t *testing.T) {
		t.Parallel()
		tbl := dbtest.Table(t)
		write(t, tbl, "a", 4)
		prod := memory.New(memory.Config{})
		prod.FailNextCalls(1, producer.NewTopicError("not_found", errors.New("no entity")))
		m := sweep(t, tbl, prod, 2)
		require.Zero(t, testutil.ToFloat64(m.ResentTotal("a", outbox.ResendUnknownOutcome)))
	})
	t.Run("rolled back", func(t *testing.T) {
		t.Parallel()
		tbl := dbtest.Table(t)
		write(t, tbl, "a", 6)
		// The sixth row is refused, and its dead-lettering fails (the
		// dead-letter table is gone): the page rolls back, and the five
		// rows the broker took before it are left to be sent again.
		_, err := dbtest.Pool(t).Exec(ctx, "ALTER TABLE "+tbl.DeadLetterIdent()+" RENAME TO gone_"+tbl.Name)
		require.NoError(t, err)
		prod := memory.New(memory.Config{MaxBatch: 5})
		prod.FailMessage(6, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("bad")))
		m := metrics.New(prometheus.NewRegistry())
		s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl, Observer: m, Concurrency: 1})
		require.NoError(t, err)
		_, err = s.Sweep(ctx)
		require.Error(t, err, "the dead-lettering failed")
		require.Equal(t, 5.0, testutil.ToFloat64(m.ResentTotal("a", outbox.ResendRolledBack)))
		require.Equal(t, 6, dbtest.Outstanding(t, tbl))
	})
}

// The gauges read on a schedule survive an outstanding row whose created_at
// is infinite (written before migration 8): its age counts as 0, where the
// refresh used to fail on it.
func TestRefreshReadsAnInfiniteCreatedAt(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, "ALTER TABLE "+tbl.Ident()+" DROP CONSTRAINT "+tbl.Name+"_created_at_finite")
	require.NoError(t, err)
	_, err = dbtest.Pool(t).Exec(ctx, "INSERT INTO "+tbl.Ident()+` (topic, payload, created_at) VALUES ('t', '\x01', '-infinity')`)
	require.NoError(t, err)
	m := metrics.New(prometheus.NewRegistry())
	require.NoError(t, m.Refresh(ctx, dbtest.Pool(t), tbl, breaker.New(breaker.Settings{})))
}

// outbox_metrics_refreshed_timestamp_seconds moves with a refresh read in
// full and holds still when one fails: the gauges it dates then hold old
// values, and only this says so.
func TestRefreshedTimestampMovesOnlyWithARefreshReadInFull(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	m := metrics.New(prometheus.NewRegistry())
	require.Zero(t, testutil.ToFloat64(m.RefreshedGauge()), "no refresh yet")

	before := float64(time.Now().UnixNano()) / 1e9
	require.NoError(t, m.Refresh(ctx, dbtest.Pool(t), tbl, breaker.New(breaker.Settings{})))
	first := testutil.ToFloat64(m.RefreshedGauge())
	require.GreaterOrEqual(t, first, before-1)
	require.LessOrEqual(t, first, float64(time.Now().UnixNano())/1e9+1)

	_, err := dbtest.Pool(t).Exec(ctx, "DROP TABLE "+pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize())
	require.NoError(t, err)
	require.Error(t, m.Refresh(ctx, dbtest.Pool(t), tbl, breaker.New(breaker.Settings{})))
	require.Equal(t, first, testutil.ToFloat64(m.RefreshedGauge()), "a failed refresh dates nothing")
}
