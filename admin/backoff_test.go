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
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// A topic whose row failed alone (the broker up) waits before its next try;
// GET /topics/backoff shows it with its failures in a row and the wait left.
func TestBackoffListsWaitingTopics(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: "orders", Payload: []byte("x")}))
	prod := memory.New(memory.Config{})
	prod.FailTopic("orders", errors.New("unclassified"))
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl, Retry: breaker.Retry{Attempts: 1, Initial: time.Minute, Max: time.Minute}})
	require.NoError(t, err)
	_, err = s.Sweep(context.Background())
	require.NoError(t, err)

	b := &bundle{}
	b.srv = httptest.NewServer(admin.Handler(admin.Config{Token: "tok", Pool: dbtest.Pool(t), Table: tbl,
		Topics: s.TopicBreaker(), Backoffs: s.TopicBackoffs}))
	t.Cleanup(b.srv.Close)
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
