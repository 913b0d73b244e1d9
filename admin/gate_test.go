package admin_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// gateBundle serves the API over a sweeper that has swept once, with its gate
// and its breakers wired as the relay wires them, and returns the sweeper.
func gateBundle(t *testing.T, prod *memory.Producer, dep *breaker.Dependency, topics ...string) (*bundle, *outbox.Sweeper) {
	t.Helper()
	tbl := dbtest.Table(t)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	for _, topic := range topics {
		require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: topic, Payload: []byte("x")}))
	}
	cfg := outbox.Config{Table: tbl, Retry: breaker.Retry{Attempts: 1, Initial: time.Minute, Max: time.Minute}}
	if dep != nil {
		cfg.BrokerBreaker = dep
	}
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, cfg)
	require.NoError(t, err)
	_, err = s.Sweep(context.Background())
	require.NoError(t, err)
	b := &bundle{tbl: tbl}
	b.srv = httptest.NewServer(admin.Handler(admin.Config{Token: "tok", Pool: dbtest.Pool(t), Table: tbl,
		Topics: s.TopicBreaker(), Dependency: dep, Gate: s, Backoffs: s.TopicBackoffs, Activity: s.TopicActivity,
		StatusCacheFor: time.Hour}))
	t.Cleanup(b.srv.Close)
	return b, s
}

// statusTopic returns topic as GET /status lists it.
func statusTopic(t *testing.T, b *bundle, topic string) map[string]any {
	t.Helper()
	code, body := b.call(t, "GET", "/status", "tok", "")
	require.Equal(t, 200, code, "%v", body)
	for _, e := range body["topics"].([]any) {
		if e.(map[string]any)["topic"] == topic {
			return e.(map[string]any)
		}
	}
	require.Failf(t, "topic not listed", "%s in %v", topic, body["topics"])
	return nil
}

// A topic the broker refuses trips: /status says why it does not send with
// the gate's answer (tripped, its cooldown in ticks, the error), beside the
// breaker's own fields, which stay as they were.
func TestStatusNamesATrippedTopicsGate(t *testing.T) {
	t.Parallel()
	prod := memory.New(memory.Config{})
	prod.FailTopic("orders", producer.NewTopicError("topic_not_found", errors.New("no such queue")))
	b, s := gateBundle(t, prod, nil, "orders", "invoices")

	want := s.Gate("orders", time.Now())
	require.Equal(t, outbox.GateTripped, want.Reason)
	got := statusTopic(t, b, "orders")
	require.Equal(t, "tripped", got["state"], "the breaker's field, as before")
	g, ok := got["gate"].(map[string]any)
	require.True(t, ok, "a held topic has a gate: %v", got)
	require.Equal(t, "tripped", g["reason"])
	require.Equal(t, false, g["send"])
	require.EqualValues(t, want.CooldownTicks, g["cooldown_ticks"])
	require.Positive(t, g["cooldown_ticks"])
	require.Contains(t, g["detail"], "no such queue")
	require.NotContains(t, g, "until", "a cooldown ends after ticks, not at a time")
	require.NotContains(t, statusTopic(t, b, "invoices"), "gate", "nothing holds a topic that sent")
}

// A topic whose row failed alone backs off: /status names the reason and
// the time the gate lets it send again, the same time the backoff list
// gives.
func TestStatusNamesABackingOffTopicsGateAndUntil(t *testing.T) {
	t.Parallel()
	prod := memory.New(memory.Config{})
	prod.FailTopic("orders", errors.New("unclassified"))
	b, s := gateBundle(t, prod, nil, "orders")

	want := s.Gate("orders", time.Now())
	require.Equal(t, outbox.GateBackoff, want.Reason)
	got := statusTopic(t, b, "orders")
	require.Greater(t, got["backoff_seconds"].(float64), 20.0, "the backoff's field, as before")
	g := got["gate"].(map[string]any)
	require.Equal(t, "backoff", g["reason"])
	require.Equal(t, false, g["send"])
	until, err := time.Parse(time.RFC3339Nano, g["until"].(string))
	require.NoError(t, err)
	require.True(t, want.Until.Equal(until), "until %s, the gate's %s", until, want.Until)
	backoffs := s.TopicBackoffs()
	require.Len(t, backoffs, 1)
	require.True(t, backoffs[0].Until.Equal(until), "the backoff list's time")
}

// An open broker breaker holds every topic: /status says it once, as the
// broker breaker's gate.
func TestStatusNamesTheBrokerGate(t *testing.T) {
	t.Parallel()
	dep := breaker.NewDependency(breaker.DependencyConfig{})
	t.Cleanup(func() { _ = dep.Close(context.Background()) })
	b, _ := gateBundle(t, memory.New(memory.Config{}), dep, "orders")
	code, body := b.call(t, "GET", "/status", "tok", "")
	require.Equal(t, 200, code, "%v", body)
	require.NotContains(t, body["broker_breaker"], "gate", "a closed breaker holds nothing")

	dep.Trip("failover")
	code, body = b.call(t, "GET", "/status", "tok", "")
	require.Equal(t, 200, code, "%v", body)
	require.Equal(t, "broker_open", body["broker_breaker"].(map[string]any)["gate"])
}

// A topic whose row failed alone (the broker up) waits before its next try;
// GET /topics/backoff shows it with its failures in a row and the wait left.
func TestBackoffListsWaitingTopics(t *testing.T) {
	t.Parallel()
	prod := memory.New(memory.Config{})
	prod.FailTopic("orders", errors.New("unclassified"))
	b, _ := gateBundle(t, prod, nil, "orders")
	code, body := b.call(t, "GET", "/topics/backoff", "tok", "")
	require.Equal(t, 200, code, "%v", body)
	list := body["backoff"].([]any)
	require.Len(t, list, 1)
	entry := list[0].(map[string]any)
	require.Equal(t, "orders", entry["topic"])
	require.EqualValues(t, 1, entry["failures"])
	require.Greater(t, entry["wait_seconds"].(float64), 20.0, "about half a minute to a minute left")
	code, _ = b.call(t, "GET", "/topics/backoff", "", "")
	require.Equal(t, 401, code, "behind the token")
}
