// Package admin is the sweeper's admin HTTP API: health and readiness, an
// overview (/status), the topic breaker (list, trip, reset), the broker
// breaker (state, trip, reset), and dead letters (list, replay, purge). JSON
// in and out, standard library routing, described by openapi.json.
//
// With a token set, every call but /healthz, /readyz, /metrics and
// /openapi.json needs
// "Authorization: Bearer <token>". Without one, the server refuses to listen on
// anything but a loopback address: these calls change what the sweeper sends.
// Whatever the token, what a web page of another site can make a browser
// send is refused (guard.go): a request whose Host is not the API's, a POST
// that is not JSON, a POST from another origin.
package admin

import (
	"bytes"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// Config configures the admin API.
type Config struct {
	// Addr is where to listen, e.g. 127.0.0.1:7488 (AddrDefault).
	Addr string
	// Token, when set, is required as a bearer token on every call but the
	// health, readiness and metrics endpoints. CheckToken says which tokens
	// are refused.
	Token string
	// AllowedHosts are names, besides Addr's, by which clients call the API
	// (a proxy's or a Service's): a request whose Host header names anything
	// else is refused (see guard.go). IP literals are served too unless Addr
	// is loopback. Nil allows no other name.
	AllowedHosts []string
	// Pool and Table serve /readyz (database reachable, migrations current).
	Pool  *pgxpool.Pool
	Table outbox.Table
	// Topics is the topic breaker.
	Topics breaker.Breaker
	// Dependency is the dependency breaker; nil if there is none.
	Dependency *breaker.Dependency
	// DeadLetters serves the /dlq endpoints.
	DeadLetters *outbox.DeadLetters
	// Backoffs lists the topics waiting after transient failures
	// (Sweeper.TopicBackoffs), for GET /topics/backoff; nil leaves it out.
	Backoffs func() []outbox.TopicBackoff
	// Activity lists what this process did per topic in the last minute
	// (Sweeper.TopicActivity), for GET /status; nil shows zeros.
	Activity func() []outbox.TopicActivity
	// Metrics serves /metrics; nil leaves it out.
	Metrics http.Handler
	// Logger receives the causes of internal errors, which callers do not see.
	Logger *slog.Logger
	// StatusCacheFor is how long GET /status answers from the backlog it
	// read last. Zero means StatusCacheForDefault.
	StatusCacheFor time.Duration
	// UI serves the console, a web page over this API, at /.
	UI bool
	// Stalled, when set, makes /healthz answer 503 while it reports the
	// sweep loop stalled (outbox.Sweeper.Stalled with --stall-ticks), so that
	// Kubernetes restarts a wedged process.
	Stalled func(now time.Time) (outbox.Stall, bool)
	// DegradedDeadLetters is how many dead letters GET /status tolerates:
	// more make it say degraded. Zero means DegradedDeadLettersDefault;
	// negative, never.
	DegradedDeadLetters int
	// StatusTopics is the most topics GET /status lists (see capTopics);
	// topics_omitted counts the rest. Zero means StatusTopicsDefault.
	StatusTopics int
	// SweepsFailing, when set, makes GET /status say degraded, with the last
	// error, while DegradedSweepFailures or more sweeps in a row have failed
	// (outbox.Sweeper.Failing).
	SweepsFailing func() (outbox.SweepFailure, bool)
}

// Handler returns the API's handler.
func Handler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StatusCacheFor == 0 {
		cfg.StatusCacheFor = StatusCacheForDefault
	}
	a := &api{cfg: cfg, hosts: newHostRule(cfg.Addr, cfg.AllowedHosts)}
	a.backlog, a.backlogErr = outbox.NewBacklog(cfg.Pool, cfg.Table)
	mux := http.NewServeMux()
	for _, r := range a.routes() {
		mux.Handle(r.pattern, r.h)
	}
	return a.jsonErrors(mux)
}

// route is one endpoint: its method and path, as the mux takes them.
type route struct {
	pattern string
	h       http.Handler
}

// routes lists every endpoint the API serves; openapi.json describes each,
// and a test holds the two to each other.
func (a *api) routes() []route {
	open := func(pattern string, h http.HandlerFunc) route { return route{pattern, h} }
	guarded := func(pattern string, h http.HandlerFunc) route { return route{pattern, a.auth(h)} }
	rs := []route{
		open("GET /healthz", a.healthz),
		open("GET /readyz", a.readyz),
		open("GET /openapi.json", serveOpenAPI),
		guarded("GET /status", a.status),
		guarded("GET /breaker", a.breakerState),
		guarded("POST /breaker/trip", a.breakerTrip),
		guarded("POST /breaker/reset", a.breakerReset),
		guarded("GET /dlq", a.dlqList),
		guarded("POST /dlq/purge", a.dlqPurge),
		guarded("POST /dlq/replay", a.dlqReplay),
		guarded("GET /topics/tripped", a.tripped),
		guarded("POST /topics/reset", a.reset),
		guarded("POST /topics/trip", a.trip),
		guarded("POST /topics/{topic}/reset", a.reset),
		guarded("POST /topics/{topic}/trip", a.trip),
		// Go's profiles, for finding where a slow relay spends its time
		// (go tool pprof 'http://127.0.0.1:7488/debug/pprof/profile?seconds=20').
		// Behind the token: a profile names functions and a heap dump holds
		// data. Shorter than the server's 30 s write timeout.
		guarded("GET /debug/pprof/", pprof.Index),
		guarded("GET /debug/pprof/cmdline", pprof.Cmdline),
		guarded("GET /debug/pprof/profile", pprof.Profile),
		guarded("GET /debug/pprof/symbol", pprof.Symbol),
		guarded("GET /debug/pprof/trace", pprof.Trace),
	}
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
		msg := fmt.Sprintf("no endpoint %s %s: the endpoints are in the README's \"Admin HTTP API\"", r.Method, r.URL.Path)
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

type api struct {
	cfg        Config
	hosts      hostRule
	backlog    *outbox.Backlog
	backlogErr error

	// The last answer of the backlog queries, for StatusCacheFor: several
	// pages polling /status cost the database one query at a time.
	cacheMu    sync.Mutex
	cachedAt   time.Time
	cachedTops []outbox.TopicBacklog
	cachedDead []outbox.DeadLetterGroup
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

// internal answers 500 without the cause, which goes to the log.
func (a *api) internal(w http.ResponseWriter, r *http.Request, err error) {
	a.cfg.Logger.Error("admin API call failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeJSON(w, http.StatusInternalServerError, errorBody{"internal error: see the sweeper's log"})
}

// filter reads the dead-letter filter from the query string: topic, reason,
// since (a duration), id (comma-separated).
func filterFromQuery(r *http.Request) (outbox.DeadLetterFilter, error) {
	q := r.URL.Query()
	f := outbox.DeadLetterFilter{Topic: q.Get("topic"), Reason: q.Get("reason")}
	if err := checkText("query parameter topic", f.Topic, filterHint); err != nil {
		return f, err
	}
	if err := checkText("query parameter reason", f.Reason, filterHint); err != nil {
		return f, err
	}
	if s := q.Get("since"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return f, fmt.Errorf("since=%s is not a duration like 24h", quoteShort(s))
		}
		f.Since = time.Now().Add(-d)
	}
	if s := q.Get("id"); s != "" {
		ids, err := parseIDs(s)
		if err != nil {
			return f, err
		}
		f.IDs = ids
	}
	return f, nil
}

// parseCursor reads the next_cursor of a previous page: the microseconds of
// its last row's dead_lettered_at and its id.
func parseCursor(s string) (*outbox.DeadLetterCursor, error) {
	at, id, ok := strings.Cut(s, "-")
	micros, err1 := strconv.ParseInt(at, 10, 64)
	n, err2 := strconv.ParseInt(id, 10, 64)
	if !ok || err1 != nil || err2 != nil || n < 1 {
		return nil, fmt.Errorf("cursor=%s is not a next_cursor this API gave: pass the previous page's next_cursor as it is", quoteShort(s))
	}
	return &outbox.DeadLetterCursor{At: time.UnixMicro(micros), ID: n}, nil
}

func parseIDs(s string) ([]int64, error) {
	var ids []int64
	for _, p := range strings.Split(s, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
		if err != nil || id < 1 {
			return nil, fmt.Errorf("id=%s: ids are whole numbers separated by commas", quoteShort(s))
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func (a *api) dlqList(w http.ResponseWriter, r *http.Request) {
	f, err := filterFromQuery(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	limit := 50
	if s := r.URL.Query().Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 || limit > 10_000 {
			badRequest(w, "limit=%s: a whole number from 1 to 10000", quoteShort(s))
			return
		}
	}
	showPayload := r.URL.Query().Get("show_payload") == "true"
	var after *outbox.DeadLetterCursor
	if c := r.URL.Query().Get("cursor"); c != "" {
		if after, err = parseCursor(c); err != nil {
			badRequest(w, "%v", err)
			return
		}
	}
	list, next, err := a.cfg.DeadLetters.ListPage(r.Context(), f, after, limit, showPayload)
	if err != nil {
		a.internal(w, r, err)
		return
	}
	if list == nil {
		list = []outbox.DeadLetter{}
	}
	out := map[string]any{"dead_letters": list}
	if next != nil {
		out["next_cursor"] = fmt.Sprintf("%d-%d", next.At.UnixMicro(), next.ID)
	}
	writeJSON(w, http.StatusOK, out)
}

// selection is the body of replay and purge.
type selection struct {
	IDs       []int64 `json:"ids"`
	Topic     string  `json:"topic"`
	Reason    string  `json:"reason"`
	Since     string  `json:"since"`      // replay: a duration
	OlderThan string  `json:"older_than"` // purge: a duration
	All       bool    `json:"all"`
	DryRun    bool    `json:"dry_run"` // count, change nothing
}

func decodeSelection(r *http.Request) (selection, outbox.DeadLetterFilter, error) {
	var s selection
	raw, err := readBody(r)
	if err != nil {
		return s, outbox.DeadLetterFilter{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, outbox.DeadLetterFilter{}, fmt.Errorf("body is not the JSON expected (ids, topic, reason, since, older_than, all, dry_run): %v", err)
	}
	f := outbox.DeadLetterFilter{IDs: s.IDs, Topic: s.Topic, Reason: s.Reason, All: s.All}
	// The JSON held UTF-8 (readBody saw to it), but an escape such as \u0000
	// still decodes to a NUL.
	if err := checkText("body field topic", f.Topic, filterHint); err != nil {
		return s, f, err
	}
	if err := checkText("body field reason", f.Reason, filterHint); err != nil {
		return s, f, err
	}
	for _, d := range []struct {
		name, v string
		set     func(time.Duration)
	}{{"since", s.Since, func(d time.Duration) { f.Since = time.Now().Add(-d) }}, {"older_than", s.OlderThan, func(d time.Duration) { f.Before = time.Now().Add(-d) }}} {
		if d.v == "" {
			continue
		}
		dur, err := time.ParseDuration(d.v)
		if err != nil {
			return s, f, fmt.Errorf("body field %s %s is not a duration like 720h", d.name, quoteShort(d.v))
		}
		if err := outbox.CheckAge("body field "+d.name, dur); err != nil {
			return s, f, err
		}
		d.set(dur)
	}
	return s, f, nil
}

func (a *api) dlqReplay(w http.ResponseWriter, r *http.Request) {
	s, f, err := decodeSelection(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if s.DryRun {
		// The number a confirmation shows: no lock is taken, so a replay
		// right after may move a few more or fewer.
		n, err := a.cfg.DeadLetters.Count(r.Context(), f)
		if errors.Is(err, outbox.ErrNoFilter) {
			badRequest(w, "%v", err)
			return
		}
		if err != nil {
			a.internal(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"replayed": n, "dry_run": true})
		return
	}
	n, err := a.cfg.DeadLetters.Replay(r.Context(), f)
	var missing *outbox.MissingDeadLettersError
	var conflict *outbox.ReplayConflictError
	switch {
	case errors.Is(err, outbox.ErrNoFilter), errors.As(err, &missing):
		badRequest(w, "%v", err)
	case errors.As(err, &conflict):
		// The outbox already holds a message id of the selection: nothing was
		// replayed, and the message says what to do.
		writeJSON(w, http.StatusConflict, errorBody{err.Error()})
	case err != nil:
		a.internal(w, r, err)
	default:
		a.audit(r, "dead letters replay", "count", n, "ids", f.IDs, "topic", f.Topic, "reason", f.Reason, "all", f.All)
		writeJSON(w, http.StatusOK, map[string]any{"replayed": n, "dry_run": false})
	}
}

func (a *api) dlqPurge(w http.ResponseWriter, r *http.Request) {
	s, f, err := decodeSelection(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if !f.Since.IsZero() {
		badRequest(w, "purge selects by age with older_than, not since (since would purge the newest)")
		return
	}
	n, err := a.cfg.DeadLetters.Purge(r.Context(), f, s.DryRun)
	switch {
	case errors.Is(err, outbox.ErrNoFilter):
		badRequest(w, "%v", err)
	case err != nil:
		a.internal(w, r, err)
	default:
		if !s.DryRun {
			a.audit(r, "dead letters purge", "count", n, "ids", f.IDs, "topic", f.Topic, "reason", f.Reason,
				"older_than", s.OlderThan, "all", f.All)
		}
		writeJSON(w, http.StatusOK, map[string]any{"purged": n, "dry_run": s.DryRun})
	}
}
