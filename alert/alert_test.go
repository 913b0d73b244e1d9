package alert_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/alert"
)

func TestWebhookPostsJSONAndHidesTheURLsSecret(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []alert.Alert
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		b, _ := io.ReadAll(r.Body)
		var a alert.Alert
		require.NoError(t, json.Unmarshal(b, &a))
		mu.Lock()
		defer mu.Unlock()
		got = append(got, a)
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	w := alert.Webhook{URL: srv.URL + "/hooks/SECRET-TOKEN"}
	a := alert.Alert{Time: time.Now().UTC(), Severity: alert.Critical, Component: "test", Summary: "x", Count: 3, CorrelationIDs: []string{"c1"}}
	require.NoError(t, w.Alert(context.Background(), a))
	require.Len(t, got, 1)
	require.Equal(t, 3, got[0].Count)

	status = http.StatusBadGateway
	err := w.Alert(context.Background(), a)
	require.ErrorContains(t, err, "502")
	require.NotContains(t, err.Error(), "SECRET-TOKEN")
	srv.Close()
	err = w.Alert(context.Background(), a)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "SECRET-TOKEN")
}

type slow struct {
	mu   sync.Mutex
	got  []string
	wait time.Duration
}

func (s *slow) Alert(_ context.Context, a alert.Alert) error {
	time.Sleep(s.wait)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got = append(s.got, a.Summary)
	return nil
}

func TestQueueDoesNotBlockAndDrainsOnClose(t *testing.T) {
	t.Parallel()
	s := &slow{wait: 200 * time.Millisecond}
	q := alert.NewQueue(s, slog.New(slog.DiscardHandler))
	start := time.Now()
	for _, m := range []string{"a", "b", "c"} {
		require.NoError(t, q.Alert(context.Background(), alert.Alert{Summary: m}))
	}
	require.Less(t, time.Since(start), 150*time.Millisecond, "raising an alert does not wait for delivery (200ms each)")
	q.Close(context.Background())
	require.Equal(t, []string{"a", "b", "c"}, s.got, "queued alerts delivered, in order, by Close")
}

func TestBothSendsToEach(t *testing.T) {
	t.Parallel()
	a, b := &slow{}, &slow{}
	require.NoError(t, alert.Both{a, b}.Alert(context.Background(), alert.Alert{Summary: "x"}))
	require.Equal(t, []string{"x"}, a.got)
	require.Equal(t, []string{"x"}, b.got)
}
