package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// textBundle serves the real handler with the metrics wired as the sweeper
// wires them: the breaker's state changes feed outbox_topic_tripped, and
// /metrics is served.
type textBundle struct {
	srv    *httptest.Server
	tbl    outbox.Table
	topics *breaker.Topics
	m      *metrics.Metrics
}

func setupText(t *testing.T) *textBundle {
	t.Helper()
	tbl := dbtest.Table(t)
	d, err := outbox.NewDeadLetters(dbtest.Pool(t), tbl)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	b := &textBundle{tbl: tbl, m: m, topics: breaker.New(breaker.Settings{OnStateChange: m.OnTopicChange})}
	b.srv = httptest.NewServer(admin.Handler(admin.Config{Pool: dbtest.Pool(t), Table: tbl, Topics: b.topics,
		DeadLetters: d, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}))
	t.Cleanup(b.srv.Close)
	return b
}

// do sends a request with a raw path (so that %ff reaches the server as is)
// and returns the status and the body.
func (b *textBundle) do(t *testing.T, method, rawPath, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+rawPath, strings.NewReader(body))
	require.NoError(t, err)
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(raw)
}

// errorOf decodes a JSON error answer.
func errorOf(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error string `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	require.NotEmpty(t, e.Error, body)
	return e.Error
}

// POST /topics/%ff%fe/trip used to trip the topic by that name: the metrics hook
// panicked (the request got a reset connection) and the next metrics refresh
// took the process down; every sweep until then failed, since Postgres refuses
// the name as a parameter of the sweep's query. It is now a 400 that quotes the
// value and says what to do, and nothing is tripped.
func TestTripAndResetRefuseATopicThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	b := setupText(t)
	for _, path := range []string{"/topics/%ff%fe/trip", "/topics/%ff%fe/reset", "/topics/ok%c3/trip", "/topics/a%00b/trip"} {
		code, body := b.do(t, "POST", path, `{"reason":"by hand"}`)
		require.Equal(t, http.StatusBadRequest, code, "%s: %s", path, body)
		msg := errorOf(t, body)
		require.Contains(t, msg, "topic ", path)
		require.Contains(t, msg, "by hand", "the message says what to do about a topic that is not UTF-8")
	}
	code, body := b.do(t, "POST", "/topics/%ff%fe/trip", "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Equal(t, `topic "\xff\xfe" is not valid UTF-8: the API takes topics and filters as UTF-8 text, as the outbox's text columns hold them; `+
		`send the text's UTF-8 bytes (percent-encoded in a URL: café is caf%C3%A9); a topic that is not UTF-8 (rows of a SQL_ASCII database) `+
		`cannot be tripped or reset by hand; its breaker trips and recovers by itself`, errorOf(t, body))
	code, body = b.do(t, "POST", "/topics/a%00b/trip", "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, errorOf(t, body), `topic "a\x00b" holds a NUL byte`)
	require.Empty(t, b.topics.Tripped(), "nothing was tripped")

	// A reason that is not UTF-8 is refused too, naming the field: JSON would
	// have turned it into U+FFFD without a word.
	code, body = b.do(t, "POST", "/topics/orders/trip", "{\"reason\":\"bad\xffreason\"}")
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, errorOf(t, body), `body field reason "bad\xffreason" is not valid UTF-8`)
	require.Empty(t, b.topics.Tripped())

	// A UTF-8 topic, percent-encoded, trips and shows in the metrics, which
	// still serve.
	code, body = b.do(t, "POST", "/topics/caf%C3%A9/trip", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, breaker.StateTripped, b.topics.State("café"))
	require.NoError(t, b.m.Refresh(context.Background(), dbtest.Pool(t), b.tbl, b.topics))
	code, body = b.do(t, "GET", "/metrics", "")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `outbox_topic_tripped{topic="café"} 1`)
}

// GET /dlq?topic=%ff answered 500: Postgres refused the filter as a parameter.
// Every filter that is not UTF-8 or holds a NUL, in the query or in a body, is
// now a 400 naming where it came from and quoting the value.
func TestDeadLetterFiltersThatAreNotUTF8AreA400(t *testing.T) {
	t.Parallel()
	b := setupText(t)
	for _, tc := range []struct {
		method, path, body, want string
	}{
		{"GET", "/dlq?topic=%ff", "", `query parameter topic "\xff" is not valid UTF-8`},
		{"GET", "/dlq?topic=orders%fe", "", `query parameter topic "orders\xfe" is not valid UTF-8`},
		{"GET", "/dlq?reason=%ff", "", `query parameter reason "\xff" is not valid UTF-8`},
		{"GET", "/dlq?topic=a%00", "", `query parameter topic "a\x00" holds a NUL byte`},
		{"POST", "/dlq/replay", "{\"topic\":\"\xff\"}", `body field topic "\xff" is not valid UTF-8`},
		{"POST", "/dlq/replay", "{\"reason\":\"x\xfe\",\"all\":true}", `body field reason "x\xfe" is not valid UTF-8`},
		{"POST", "/dlq/replay", `{"topic":"a\u0000b"}`, `body field topic "a\x00b" holds a NUL byte`},
		{"POST", "/dlq/purge", "{\"topic\":\"\xff\",\"dry_run\":true}", `body field topic "\xff" is not valid UTF-8`},
		{"POST", "/dlq/purge", "{\"all\":true,\"x\xff\":1}", `body is not valid UTF-8 at byte 14`},
		{"POST", "/dlq/purge", `{"reason":"\u0000"}`, `body field reason "\x00" holds a NUL byte`},
	} {
		code, body := b.do(t, tc.method, tc.path, tc.body)
		require.Equal(t, http.StatusBadRequest, code, "%s %s %q: %s", tc.method, tc.path, tc.body, body)
		msg := errorOf(t, body)
		require.Contains(t, msg, tc.want, "%s %s %q", tc.method, tc.path, tc.body)
	}
	code, body := b.do(t, "GET", "/dlq?topic=%ff", "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, errorOf(t, body), "by id", "the message says how to reach such dead letters")

	// A long value is quoted in part, with its length.
	code, body = b.do(t, "GET", "/dlq?topic="+strings.Repeat("%ff", 10_000), "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, errorOf(t, body), `"… (10000 bytes) is not valid UTF-8`)
	require.Less(t, len(body), 2000)

	// A valid filter still works.
	code, body = b.do(t, "GET", "/dlq?topic=caf%C3%A9", "")
	require.Equal(t, http.StatusOK, code, body)
}

// No request, whatever bytes it carries where a topic or filter goes, panics
// the process or gets a 500.
func TestNoRequestBytesGetA500(t *testing.T) {
	t.Parallel()
	b := setupText(t)
	values := []string{"%ff", "%fe%ff", "%c3", "%ed%a0%80", "%f4%90%80%80", "%00", "%c0%af", "a%ffb", strings.Repeat("%ff", 3000)}
	bodies := []string{"\xff", "\"\xff\"", "{\"topic\":\"\xff", "{\"ids\":[1],\"topic\":\"\\ud800\"}", "{\"\xff\":\"x\"}", "{\"topic\":\"\\u0000\",\"all\":true}"}
	for _, v := range values {
		for _, req := range []struct{ method, path string }{
			{"POST", "/topics/" + v + "/trip"}, {"POST", "/topics/" + v + "/reset"},
			{"GET", "/dlq?topic=" + v}, {"GET", "/dlq?reason=" + v}, {"GET", "/dlq?since=" + v}, {"GET", "/dlq?id=" + v},
			{"GET", "/dlq?limit=" + v},
		} {
			code, body := b.do(t, req.method, req.path, "")
			require.Less(t, code, 500, "%s %s: %s", req.method, req.path, body)
		}
	}
	for _, body := range bodies {
		for _, path := range []string{"/dlq/replay", "/dlq/purge", "/topics/orders/trip"} {
			code, answer := b.do(t, "POST", path, body)
			require.Less(t, code, 500, "POST %s %q: %s", path, body, answer)
		}
	}
	require.NoError(t, b.m.Refresh(context.Background(), dbtest.Pool(t), b.tbl, b.topics))
	code, _ := b.do(t, "GET", "/metrics", "")
	require.Equal(t, http.StatusOK, code)
}
