package alert_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
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

// recording is an alerter that records what it got, in order.
type recording struct {
	mu  sync.Mutex
	got []string
}

func (r *recording) Alert(_ context.Context, a alert.Alert) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, a.Summary)
	return nil
}

func (r *recording) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// held is a receiver that takes as long as the test says: each delivery tells
// started, then waits for release.
type held struct {
	recording
	started chan string
	release chan struct{}
}

func (h *held) Alert(ctx context.Context, a alert.Alert) error {
	h.started <- a.Summary
	<-h.release
	return h.recording.Alert(ctx, a)
}

// closeSpy is a context that tells when its Done channel is first asked for:
// Notifier.Close asks for it once it has stopped taking alerts and waits for
// their delivery.
type closeSpy struct {
	context.Context
	once    sync.Once
	waiting chan struct{}
}

func (c *closeSpy) Done() <-chan struct{} {
	c.once.Do(func() { close(c.waiting) })
	return c.Context.Done()
}

// Raising an alert never waits for its delivery: with the receiver stuck on
// the first one, three alerts are raised all the same; Close then waits for
// the queued ones and delivers them in order.
func TestNotifierDoesNotBlockAndDrainsOnClose(t *testing.T) {
	t.Parallel()
	h := &held{started: make(chan string, 3), release: make(chan struct{})}
	q := alert.NewNotifier(h, alert.NotifierConfig{})
	raised := make(chan error, 1)
	go func() {
		var err error
		for _, m := range []string{"a", "b", "c"} {
			err = errors.Join(err, q.Alert(context.Background(), alert.Alert{Summary: m}))
		}
		raised <- err
	}()
	// No delivery can finish before release: had raising waited for one, the
	// alerts would never all be raised.
	select {
	case err := <-raised:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("raising an alert waited for its delivery")
	}
	select {
	case first := <-h.started:
		require.Equal(t, "a", first, "the first alert is the first delivered")
	case <-time.After(30 * time.Second):
		t.Fatal("the queue never delivered the first alert")
	}
	require.Empty(t, h.snapshot(), "nothing delivered yet: the receiver is held")

	// Close with b and c still queued and a in delivery; release the receiver
	// only once Close is waiting, so that what it delivers it delivers while
	// closing.
	spy := &closeSpy{Context: context.Background(), waiting: make(chan struct{})}
	closed := make(chan struct{})
	go func() { q.Close(spy); close(closed) }()
	select {
	case <-spy.waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("Close never waited for the queued alerts")
	}
	close(h.release)
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return once the receiver answered")
	}
	require.Equal(t, []string{"a", "b", "c"}, h.snapshot(), "queued alerts delivered, in order, by Close")
}

func TestBothSendsToEach(t *testing.T) {
	t.Parallel()
	a, b := &recording{}, &recording{}
	require.NoError(t, alert.Both{a, b}.Alert(context.Background(), alert.Alert{Summary: "x"}))
	require.Equal(t, []string{"x"}, a.snapshot())
	require.Equal(t, []string{"x"}, b.snapshot())
}
