package admin

import (
	"cmp"
	"context"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"
)

// route is one endpoint: its method and path, as the mux takes them.
type route struct {
	pattern string
	h       http.Handler
}

// routes lists every endpoint the API serves; openapi.json describes each,
// and a test holds the two to each other.
func (a *api) routes() []route {
	open := func(pattern string, h http.HandlerFunc) route { return route{pattern, h} }
	guarded := func(pattern string, h http.HandlerFunc) route { return route{pattern, a.auth(a.bounded(h))} }
	rs := []route{
		open("GET /healthz", a.healthz),
		open("GET /readyz", a.readyz),
		open("GET /openapi.json", serveOpenAPI),
		guarded("GET /status", a.status),
		guarded("GET /breaker", a.breakerState),
		guarded("POST /breaker/trip", a.breakerTrip),
		guarded("POST /breaker/reset", a.breakerReset),
		guarded("GET /dlq", a.dlqList),
		// Not bounded: a purge or a replay is one statement, all or nothing,
		// and one of a large table outlasts the bound; cut short, it rolled
		// back every time (an independent review). It ends when its caller
		// goes.
		route{"POST /dlq/purge", a.auth(a.dlqPurge)},
		route{"POST /dlq/replay", a.auth(a.dlqReplay)},
		guarded("GET /topics/tripped", a.tripped),
		guarded("POST /topics/reset", a.reset),
		guarded("POST /topics/trip", a.trip),
		guarded("POST /topics/{topic}/reset", a.reset),
		guarded("POST /topics/{topic}/trip", a.trip),
	}
	rs = append(rs, a.profiles()...)
	if a.cfg.Metrics != nil {
		rs = append(rs, route{"GET /metrics", a.cfg.Metrics})
	}
	if a.cfg.Backoffs != nil {
		rs = append(rs, guarded("GET /topics/backoff", a.backoffs))
	}
	if a.cfg.UI {
		// The page and its files hold no data: the page asks the API,
		// with the token the operator signs in with.
		rs = append(rs, route{"GET /{$}", page("index.html", "text/html; charset=utf-8")},
			route{"GET /ui/app.js", page("app.js", "text/javascript; charset=utf-8")},
			route{"GET /ui/style.css", page("style.css", "text/css; charset=utf-8")})
	}
	return rs
}

// profiles are Go's profiles, for finding where a slow relay spends its
// time ('http://127.0.0.1:7488/debug/pprof/profile?seconds=20'; pprof moves
// the server's 30 s write deadline out by the duration asked for).
// Behind the token: a profile names functions and a heap dump holds data. A
// fleet serves them at its root too (fleet.go): they are the process's.
func (a *api) profiles() []route {
	// Not bounded: a profile runs for the seconds it is asked.
	guarded := func(pattern string, h http.HandlerFunc) route { return route{pattern, a.auth(h)} }
	return []route{
		guarded("GET /debug/pprof/", pprof.Index),
		guarded("GET /debug/pprof/cmdline", pprof.Cmdline),
		guarded("GET /debug/pprof/profile", pprof.Profile),
		guarded("GET /debug/pprof/symbol", pprof.Symbol),
		guarded("GET /debug/pprof/trace", pprof.Trace),
	}
}

//go:embed ui
var ui embed.FS

// pageCSP lets the console run its own script and style and call this API,
// and nothing else: no inline script, no other origin, no framing, and no
// form submission (the sign-in form is the script's; submitted by the
// browser, it would put the token in a URL).
const pageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// page serves file of the console with its content type.
func page(file, contentType string) http.Handler {
	body, err := ui.ReadFile("ui/" + file)
	if err != nil {
		panic(fmt.Sprintf("admin: the console's %s is not embedded: %v", file, err))
	}
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Security-Policy", pageCSP)
		w.Header().Set("Content-Type", contentType)
		_, _ = w.Write(body)
	})
}

//go:embed openapi.json
var openAPI []byte

// serveOpenAPI serves the API's OpenAPI 3.1 description. It needs no token:
// it describes the API, and holds nothing of the sweeper's.
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(openAPI)
}

// jsonErrors answers what the mux itself refuses, a path it has no route for
// (404) or a method a route does not take (405, with the Allow header), in
// JSON like every other error, instead of the mux's plain text: a client
// decodes every answer the same way. Every answer gets the secure headers,
// and every request the checks of guard.go.
func (a *api) jsonErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secure(w.Header())
		_, pattern := mux.Handler(r)
		if no := a.check(r, pattern != ""); no != nil {
			a.cfg.Logger.Warn("admin API request refused", "method", r.Method, "path", r.URL.Path, "status", no.status,
				"host", cut(r.Host), "origin", cut(r.Header.Get("Origin")),
				"sec_fetch_site", r.Header.Get("Sec-Fetch-Site"), "remote", r.RemoteAddr)
			writeJSON(w, no.status, errorBody{no.msg})
			return
		}
		if pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		rec := &statusOnly{header: w.Header(), status: http.StatusNotFound}
		mux.ServeHTTP(rec, r)
		msg := fmt.Sprintf("no endpoint %s %s: the endpoints are in docs/operations.md, \"Admin HTTP API\"%s", r.Method, r.URL.Path, a.elsewhere)
		if rec.status == http.StatusMethodNotAllowed {
			msg = fmt.Sprintf("%s does not take %s: use %s", r.URL.Path, r.Method, w.Header().Get("Allow"))
		}
		writeJSON(w, rec.status, errorBody{msg})
	})
}

// secure sets the headers every answer carries: nothing of the API is to be
// framed, sniffed as another type, run as a page's script, cached or sent on
// as a referrer; its answers hold topics, errors and dead letters.
func secure(h http.Header) {
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// statusOnly keeps the status a handler writes, and its headers, and drops
// its body.
type statusOnly struct {
	header http.Header
	status int
}

func (s *statusOnly) Header() http.Header         { return s.header }
func (s *statusOnly) WriteHeader(status int)      { s.status = status }
func (s *statusOnly) Write(b []byte) (int, error) { return len(b), nil }

// audit logs an operator's change at info: what, to what, and from where.
func (a *api) audit(r *http.Request, action string, attrs ...any) {
	a.cfg.Logger.Info("admin action", append([]any{"action", action, "remote", r.RemoteAddr, "user_agent", r.UserAgent()}, attrs...)...)
}

// auth requires the bearer token, when one is configured, compared in
// constant time.
func (a *api) auth(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if a.cfg.Token != "" {
			scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), []byte(a.cfg.Token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="outbox-sweeper"`)
				writeJSON(w, http.StatusUnauthorized, errorBody{"missing or wrong bearer token"})
				return
			}
		}
		h(w, r)
	})
}

// RequestTimeoutDefault bounds a call of the API that reads or changes the
// database: its statements end with it, and the answer says so, within the
// server's 30 s write deadline. Without it a database that hung held the
// call, and the relay's connection it used, for good (an independent
// review, 2026-11-29).
const RequestTimeoutDefault = 20 * time.Second

// requestTimeout is Config.RequestTimeout, or its default: an api made
// without Handler (a fleet's own routes, tests) has no defaults filled in.
func (a *api) requestTimeout() time.Duration {
	return cmp.Or(a.cfg.RequestTimeout, RequestTimeoutDefault)
}

// bounded runs h with the request timeout on its request's context.
func (a *api) bounded(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), a.requestTimeout())
		defer cancel()
		h(w, r.WithContext(ctx))
	}
}

type errorBody struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func badRequest(w http.ResponseWriter, format string, args ...any) {
	writeJSON(w, http.StatusBadRequest, errorBody{fmt.Sprintf(format, args...)})
}

// internal answers 500 without the cause, which goes to the log; or, when
// the cause is that the database cannot be reached (a restart, a failover, a
// network cut), 503 with the database's name, since the operator's next step
// is then to wait for it or fix it, not to read a stack of errors; and says
// whether the call can be made again as it was (a read, or a change that
// never reached the database) or should be looked at first.
func (a *api) internal(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.DeadlineExceeded) && errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		a.cfg.Logger.Warn("admin API call failed: the database did not answer in time", "method", r.Method, "path", r.URL.Path,
			"timeout", a.requestTimeout(), "err", err)
		outcome := "nothing was read or changed; call again"
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			outcome = "the change may or may not have been made: look (GET) before calling again"
		}
		w.Header().Set("Retry-After", "5")
		writeJSON(w, http.StatusServiceUnavailable, errorBody{fmt.Sprintf(
			"the database did not answer within %s (a lock held, or the server hung): %s", a.requestTimeout(), outcome)})
		return
	}
	if unreachable(err) {
		name := databaseName(err, a.cfg)
		a.cfg.Logger.Warn("admin API call failed: database unreachable", "method", r.Method, "path", r.URL.Path, "database", name, "err", err)
		// A read changed nothing; a change whose connection broke after
		// its statement went may have been made.
		outcome := "nothing was read or changed; call again"
		if r.Method != http.MethodGet && r.Method != http.MethodHead && !unsent(err) {
			outcome = "the change may or may not have been made: look (GET) before calling again"
		}
		w.Header().Set("Retry-After", "5")
		writeJSON(w, http.StatusServiceUnavailable, errorBody{fmt.Sprintf(
			"database %s is unreachable: %s once GET /readyz answers 200 (the sweeper's log says why it is down)", quoteShort(name), outcome)})
		return
	}
	a.cfg.Logger.Error("admin API call failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeJSON(w, http.StatusInternalServerError, errorBody{"internal error: see the sweeper's log"})
}
