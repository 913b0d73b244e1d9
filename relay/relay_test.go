package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
	"github.com/outbox-sweeper/sweeper/relay"
)

type testBundle struct {
	notifier *alert.Notifier
	opts     relay.Options
	producer *memory.Producer
}

// setup returns a relay's options over an outbox of t's own, with a broker
// breaker and a notifier for Run to close. dbtest.Main fails the package if
// either leaves its goroutine behind.
func setup(t *testing.T) *testBundle {
	t.Helper()
	n := alert.NewNotifier(alert.Log{Logger: slog.New(slog.DiscardHandler)}, alert.NotifierConfig{})
	return &testBundle{
		notifier: n,
		producer: memory.New(memory.Config{}),
		opts: relay.Options{
			Sweeper:    outbox.Config{Table: dbtest.Table(t)},
			Dependency: breaker.NewDependency(breaker.DependencyConfig{}),
			Notifier:   n,
		},
	}
}

// requireClosed checks that the producer and the notifier take nothing more.
func requireClosed(t *testing.T, b *testBundle) {
	t.Helper()
	ctx := context.Background()
	require.Error(t, b.producer.Send(ctx, producer.Batch{Topic: "orders"}), "the producer is closed")
	require.Error(t, b.notifier.Alert(ctx, alert.Alert{Key: "k", Status: alert.Firing}), "the notifier is closed")
}

func TestRunReturnsOnceItsContextEndsWithTheProducerBreakerAndNotifierClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := relay.New(dbtest.Pool(t), b.producer, b.opts)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, r.Run(ctx))
	requireClosed(t, b)
}

func TestAnAdminAPIThatCannotListenFailsRunWithEverythingClosed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = taken.Close() })
	b.opts.Admin = admin.Config{Addr: taken.Addr().String()}
	r, err := relay.New(dbtest.Pool(t), b.producer, b.opts)
	require.NoError(t, err)
	require.ErrorContains(t, r.Run(context.Background()), "listen on "+taken.Addr().String())
	requireClosed(t, b)
}

// A schema without the history table refuses the start with the admin API
// serving: Run returns the error, saying to migrate, with everything closed.
// It waited for the API, which ended only with ctx: Run never returned,
// /healthz said ok, and the error went unsaid.
func TestAStartRefusedEndsTheAdminAPIAndRunReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tbl := b.opts.Sweeper.Table
	_, err := dbtest.Pool(t).Exec(context.Background(), "DROP TABLE "+outbox.HistoryIdent(tbl))
	require.NoError(t, err)
	b.opts.Admin = admin.Config{Addr: "127.0.0.1:0"}
	r, err := relay.New(dbtest.Pool(t), b.producer, b.opts)
	require.NoError(t, err)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(context.Background()) }()
	select {
	case err := <-ran:
		require.ErrorIs(t, err, outbox.ErrNoHistory)
		require.ErrorContains(t, err, "sweeper migrate")
	case <-time.After(time.Minute):
		t.Fatal("Run did not return on a start it refused")
	}
	requireClosed(t, b)
}

func TestNewRefusesAConfigOutOfRangeAsAConfigError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.opts.Sweeper.PageSize = outbox.PageSizeMax + 1
	_, err := relay.New(dbtest.Pool(t), b.producer, b.opts)
	_, ok := errors.AsType[*outbox.ConfigError](err)
	require.True(t, ok, "got %v", err)
	// New takes nothing over: the caller closes what it gave.
	_ = b.opts.Dependency.Close(context.Background())
	b.notifier.Close(context.Background())
}

// A metrics refresh the database does not answer (behind a lock) ends by its
// interval and the next one runs: one that hung stopped every later refresh,
// the gauges frozen, the lag alert blind.
func TestAMetricsRefreshThatHangsEndsAndTheNextRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs syncbuf.Buffer
	b.opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	b.opts.Metrics = metrics.New(prometheus.NewRegistry())
	b.opts.MetricsRefresh = 100 * time.Millisecond
	b.opts.Admin.Addr = ""
	ctx := context.Background()
	release := dbtest.LockTables(t, b.opts.Sweeper.Table.DeadLetterIdent())
	defer release()

	r, err := relay.New(dbtest.Pool(t), b.producer, b.opts)
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	dbtest.Eventually(t, time.Minute, "two refreshes failed by their deadline", func() bool {
		return strings.Count(logs.String(), "metrics refresh failed") >= 2
	})
	release()
	cancel()
	require.NoError(t, <-done)
}
