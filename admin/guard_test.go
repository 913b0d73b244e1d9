package admin_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/breaker"
)

// raw sends a request with exactly the headers given (no Content-Type
// unless given) and returns the status and the error the API answered.
func (b *bundle) raw(t *testing.T, method, path, body string, headers map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), "%s", raw)
	var e struct {
		Error string `json:"error"`
	}
	require.NoError(t, json.Unmarshal(raw, &e), "%s", raw)
	return resp.StatusCode, e.Error
}

// What a page of another site can make a browser send is refused, whatever
// the endpoint: a POST without a JSON content type (fetch's no-cors mode, a
// form), a POST that says it comes from another origin, and any request
// through a name that is not the API's (DNS rebinding). Nothing changes.
func TestRequestsABrowserOfAnotherSiteCanSendAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, "") // the default: no token, loopback
	posts := []struct{ path, body string }{
		{"/dlq/purge", `{"all":true}`}, {"/dlq/replay", `{"all":true}`}, {"/breaker/trip", `{"reason":"x"}`},
		{"/breaker/reset", ""}, {"/topics/orders/trip", `{"reason":"x"}`}, {"/topics/orders/reset", ""},
		{"/topics/trip", `{"topic":"orders"}`},
	}
	for _, p := range posts {
		for _, h := range []map[string]string{
			{}, // no-cors with an empty body
			{"Content-Type": "text/plain;charset=UTF-8"},
			{"Content-Type": "application/x-www-form-urlencoded"},
			{"Content-Type": "multipart/form-data; boundary=x"},
			{"Content-Type": "application/jsonp"},
		} {
			code, msg := b.raw(t, "POST", p.path, p.body, h)
			require.Equal(t, http.StatusUnsupportedMediaType, code, "POST %s %v", p.path, h)
			require.Contains(t, msg, "POST needs Content-Type: application/json")
		}
		for _, h := range []map[string]string{
			{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"},
			{"Content-Type": "application/json", "Sec-Fetch-Site": "same-site"}, // another port of this host
			{"Content-Type": "application/json", "Origin": "http://attacker.example"},
			{"Content-Type": "application/json", "Origin": "null"},
			{"Content-Type": "text/plain", "Sec-Fetch-Site": "cross-site", "Origin": "http://attacker.example"},
		} {
			code, msg := b.raw(t, "POST", p.path, p.body, h)
			require.Equal(t, http.StatusForbidden, code, "POST %s %v", p.path, h)
			require.Contains(t, msg, "cross-origin request refused")
		}
		code, msg := b.raw(t, "POST", p.path, p.body, map[string]string{"Content-Type": "application/json", "Host": "attacker.example:7488"})
		require.Equal(t, http.StatusForbidden, code, "POST %s", p.path)
		require.Contains(t, msg, `Host "attacker.example:7488" does not name this API`)
	}
	for _, path := range []string{"/dlq?show_payload=true", "/status", "/healthz", "/metrics", "/openapi.json", "/", "/nope"} {
		code, msg := b.raw(t, "GET", path, "", map[string]string{"Host": "attacker.example:7488"})
		require.Equal(t, http.StatusForbidden, code, "GET %s", path)
		require.Contains(t, msg, "--admin-allowed-hosts")
	}
	// A read a script of another site makes: refused (its answer is opaque to
	// the page, but the API would do the work); a link followed is served.
	for _, site := range []string{"cross-site", "same-site"} {
		for _, path := range []string{"/dlq?show_payload=true&limit=100", "/status"} {
			code, msg := b.raw(t, "GET", path, "", map[string]string{"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "no-cors"})
			require.Equal(t, http.StatusForbidden, code, "GET %s from %s", path, site)
			require.Contains(t, msg, "cannot read the sweeper's API")
		}
		code, msg := b.raw(t, "GET", "/status", "", map[string]string{"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "navigate"})
		require.Equal(t, http.StatusOK, code, "a link followed from %s: %s", site, msg)
	}
	code, msg := b.raw(t, "GET", "/dlq?show_payload=true&limit=101", "", nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, msg, "limit=101 with show_payload=true: at most 100")
	require.Len(t, readDead(t, b.tbl), 3, "nothing purged or replayed")
	require.Equal(t, breaker.DependencyClosed, b.dep.State(), "the broker breaker was not tripped")
	require.Equal(t, breaker.StateClosed, b.topics.State("orders"), "the topic was not tripped")
	require.Contains(t, b.log.String(), `"msg":"admin API request refused"`)

	// The API's own page, the CLI and curl get through.
	for _, h := range []map[string]string{
		{"Content-Type": "application/json"}, // the CLI, curl: no Origin, no Sec-Fetch-Site
		{"Content-Type": "application/json; charset=utf-8", "Sec-Fetch-Site": "same-origin", "Origin": b.srv.URL},
		{"Content-Type": "application/json", "Origin": b.srv.URL}, // a browser without Sec-Fetch-Site
		{"Content-Type": "application/json", "Host": "localhost"},
	} {
		code, msg := b.raw(t, "POST", "/dlq/purge", `{"all":true,"dry_run":true}`, h)
		require.Equal(t, http.StatusOK, code, "%v: %s", h, msg)
	}
}

// A Host named in AllowedHosts is served (a proxy's, a Service's name).
func TestAllowedHostsAreServed(t *testing.T) {
	t.Parallel()
	b := setup(t, "", func(c *admin.Config) { c.Addr = "127.0.0.1:7488"; c.AllowedHosts = []string{"sweeper.internal"} })
	code, msg := b.raw(t, "GET", "/dlq", "", map[string]string{"Host": "sweeper.internal:8443"})
	require.Equal(t, http.StatusOK, code, msg)
	code, msg = b.raw(t, "GET", "/dlq", "", map[string]string{"Host": "other.internal"})
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, msg, "it listens on 127.0.0.1:7488")
}

// The topics "." and ".." cannot travel in a URL's path (it is cleaned, by
// the browser, curl and the server's mux), so POST /topics/trip and
// /topics/reset take the topic in the body.
func TestDotTopicsAreTrippedAndResetByBody(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	for _, topic := range []string{".", "..", "orders"} {
		body, _ := json.Marshal(map[string]string{"topic": topic, "reason": "by hand"})
		code, out := b.call(t, "POST", "/topics/trip", "tok", string(body))
		require.Equal(t, 200, code, "%v", out)
		require.Equal(t, topic, out["topic"])
		require.Equal(t, "tripped", out["state"])
		require.Equal(t, breaker.StateTripped, b.topics.State(topic))
		body, _ = json.Marshal(map[string]string{"topic": topic})
		code, out = b.call(t, "POST", "/topics/reset", "tok", string(body))
		require.Equal(t, 200, code, "%v", out)
		require.Equal(t, "closed", out["state"])
		require.Equal(t, "tripped", out["previous_state"])
	}
	code, out := b.call(t, "POST", "/topics/trip", "tok", `{"reason":"no topic"}`)
	require.Equal(t, 400, code)
	require.Contains(t, out["error"], "body field topic is missing or empty")
	code, out = b.call(t, "POST", "/topics/reset", "tok", "")
	require.Equal(t, 400, code)
	require.Contains(t, out["error"], "body field topic is missing or empty")
	code, out = b.call(t, "POST", "/topics/orders/trip", "tok", `{"topic":"invoices"}`)
	require.Equal(t, 400, code)
	require.Contains(t, out["error"], `body field topic "invoices" is not the path's topic "orders"`)
	code, out = b.call(t, "POST", "/topics/trip", "tok", `{"topic":"a\u0000b"}`)
	require.Equal(t, 400, code)
	require.Contains(t, out["error"], `body field topic "a\x00b" holds a NUL byte`)
	require.Equal(t, breaker.StateClosed, b.topics.State("invoices"))
}

// A bad value is quoted short in the answer, as everywhere else: a 5,000
// character cursor is not echoed whole.
func TestBadQueryValuesAreQuotedShort(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	long := strings.Repeat("9", 5000)
	for _, q := range []string{"cursor=" + long + "x", "id=" + long + "x", "limit=" + long + "x", "since=" + long + "x"} {
		code, out := b.call(t, "GET", "/dlq?"+q, "", "")
		require.Equal(t, 400, code, q[:10])
		msg := out["error"].(string)
		require.Less(t, len(msg), 600, "%s answered %d bytes", q[:10], len(msg))
		require.Contains(t, msg, "(5001 bytes)")
	}
}
