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
	"context"
	"log/slog"
	"net/http"
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
	// Database names Pool's database in the answers and logs of a call it
	// failed: the name a relay of several databases gives it, which its
	// list may set apart from the URL's (fleet.ListedName: servers whose
	// databases share a name). Empty: the name in Pool's connection string.
	Database string
	// Topics is the topic breaker, which the operator trips and resets.
	Topics breaker.Breaker
	// Dependency is the dependency breaker, which the operator trips and
	// resets; nil if there is none.
	Dependency *breaker.Dependency
	// Gate answers "may this topic send now, and if not, why and until
	// when" (an *outbox.Sweeper, whose gate weighs Topics, Dependency, the
	// backoffs and the sweep in progress): GET /status shows its answer as
	// each held topic's gate and as broker_breaker.gate, the answer the
	// sweep's log lines give too. Nil leaves both out.
	Gate Gate
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
	// RequestTimeout bounds a call that reads or changes the database; zero
	// means RequestTimeoutDefault.
	RequestTimeout time.Duration
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

// Gate is the sweeper's gate, as GET /status asks it (see outbox.Sweeper's
// Gates and BrokerGate). Its methods are called from the API's goroutines.
type Gate interface {
	// Gates lists every topic the gate holds at now, by topic.
	Gates(now time.Time) []outbox.TopicGate
	// BrokerGate says what the broker breaker holds of every topic, or "".
	BrokerGate() outbox.GateReason
}

// Handler returns the API's handler.
func Handler(cfg Config) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.StatusCacheFor == 0 {
		cfg.StatusCacheFor = StatusCacheForDefault
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = RequestTimeoutDefault
	}
	a := &api{cfg: cfg, hosts: newHostRule(cfg.Addr, cfg.AllowedHosts)}
	a.backlog, a.backlogErr = outbox.NewBacklog(cfg.Pool, cfg.Table)
	mux := http.NewServeMux()
	for _, r := range a.routes() {
		mux.Handle(r.pattern, r.h)
	}
	return a.jsonErrors(mux)
}

type api struct {
	cfg   Config
	hosts hostRule
	// elsewhere ends the answer to a path no endpoint serves: where a
	// relay of many outboxes serves each one's endpoints.
	elsewhere  string
	backlog    *outbox.Backlog
	backlogErr error

	// The last answer of the backlog queries, for StatusCacheFor: several
	// pages polling /status cost the database one query at a time.
	cacheMu    ctxMutex
	cachedAt   time.Time
	cachedTops []outbox.TopicBacklog
	cachedDead []outbox.DeadLetterGroup
}

// ctxMutex is a mutex whose lock gives up when the caller's context ends: a
// request waiting for another's read of a database that hangs must end by
// its own deadline. The zero value is unlocked.
type ctxMutex struct {
	once sync.Once
	ch   chan struct{}
}

func (m *ctxMutex) lock(ctx context.Context) error {
	m.once.Do(func() { m.ch = make(chan struct{}, 1) })
	select {
	case m.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *ctxMutex) unlock() { <-m.ch }
