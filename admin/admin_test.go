package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

type bundle struct {
	srv    *httptest.Server
	tbl    outbox.Table
	topics *breaker.Topics
	dep    *breaker.Dependency
	log    *syncbuf.Buffer // the API's log, as JSON lines
}

// setup serves the API over a migrated outbox with three dead letters (two of
// topic "orders", one of "invoices") and a token unless token is empty.
func setup(t *testing.T, token string, opts ...func(*admin.Config)) *bundle {
	t.Helper()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, dbtest.Pool(t),
		outbox.Message{Topic: "orders", Payload: []byte("SECRET-1"), CorrelationID: "c1"},
		outbox.Message{Topic: "orders", Payload: []byte("SECRET-2"), CorrelationID: "c2"},
		outbox.Message{Topic: "invoices", Payload: []byte("SECRET-3"), CorrelationID: "c3"}))
	prod := memory.New(memory.Config{})
	for id := int64(1); id <= 3; id++ {
		prod.FailMessage(id, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("rejected")))
	}
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	require.NoError(t, err)
	_, err = s.Sweep(ctx)
	require.NoError(t, err)

	d, err := outbox.NewDeadLetters(dbtest.Pool(t), tbl)
	require.NoError(t, err)
	b := &bundle{tbl: tbl, topics: breaker.New(breaker.Settings{}),
		dep: breaker.NewDependency(breaker.DependencyConfig{}), log: &syncbuf.Buffer{}}
	t.Cleanup(func() { _ = b.dep.Close(context.Background()) })
	cfg := admin.Config{Token: token, Pool: dbtest.Pool(t), Table: tbl, Topics: b.topics,
		Dependency: b.dep, DeadLetters: d, Logger: slog.New(slog.NewJSONHandler(b.log, nil)), Activity: s.TopicActivity,
		StatusCacheFor: time.Hour} // the tests see when the cache is used, not the clock
	for _, o := range opts {
		o(&cfg)
	}
	b.srv = httptest.NewServer(admin.Handler(cfg))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *bundle) call(t *testing.T, method, path, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json") // what the API takes changes in
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	return resp.StatusCode, out
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	code, body := b.call(t, "GET", "/healthz", "", "")
	require.Equal(t, 200, code)
	require.Equal(t, "ok", body["status"])
	code, body = b.call(t, "GET", "/readyz", "", "")
	require.Equal(t, 200, code, "%v", body)

	// An outbox that was never migrated is not ready, and says why.
	notMigrated := httptest.NewServer(admin.Handler(admin.Config{Pool: dbtest.Pool(t), Table: outbox.Table{Schema: "no_such_schema"}}))
	defer notMigrated.Close()
	resp, err := http.Get(notMigrated.URL + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	raw, _ := io.ReadAll(resp.Body)
	require.Contains(t, string(raw), "run `sweeper migrate`")

	// A schema newer than this binary (migrated by a newer sweeper, then
	// this one rolled back) serves it: ready.
	tbl := dbtest.Table(t)
	_, err = dbtest.Pool(t).Exec(context.Background(), "UPDATE "+outbox.VersionIdent(tbl)+" SET version = version + 1")
	require.NoError(t, err)
	newer := httptest.NewServer(admin.Handler(admin.Config{Pool: dbtest.Pool(t), Table: tbl}))
	defer newer.Close()
	resp2, err := http.Get(newer.URL + "/readyz")
	require.NoError(t, err)
	defer resp2.Body.Close()
	raw, _ = io.ReadAll(resp2.Body)
	require.Equal(t, 200, resp2.StatusCode, "%s", raw)
}

func TestTokenIsRequiredWhenSet(t *testing.T) {
	t.Parallel()
	b := setup(t, "s3cret")
	for _, route := range []struct{ method, path string }{
		{"GET", "/topics/tripped"}, {"POST", "/topics/x/trip"}, {"POST", "/topics/x/reset"}, {"GET", "/breaker"},
		{"GET", "/dlq"}, {"POST", "/dlq/replay"}, {"POST", "/dlq/purge"},
		{"GET", "/debug/pprof/"}, {"GET", "/debug/pprof/heap"}, {"GET", "/debug/pprof/profile"}, {"GET", "/debug/pprof/trace"},
	} {
		for _, tok := range []string{"", "wrong"} {
			code, body := b.call(t, route.method, route.path, tok, `{"all":true}`)
			require.Equal(t, 401, code, "%s %s with token %q", route.method, route.path, tok)
			require.Contains(t, body["error"], "bearer token")
		}
	}
	require.Len(t, readDead(t, b.tbl), 3, "nothing was purged or replayed without the token")
	code, _ := b.call(t, "GET", "/topics/tripped", "s3cret", "")
	require.Equal(t, 200, code)
	code, _ = b.call(t, "GET", "/healthz", "", "")
	require.Equal(t, 200, code, "health needs no token")
	req, err := http.NewRequest("GET", b.srv.URL+"/debug/pprof/goroutine?debug=1", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "profiles with the token")
	require.Contains(t, string(raw), "goroutine profile:")
}

func TestRefusesANonLoopbackAddressWithoutAToken(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, admin.CheckAddr("0.0.0.0:8080", ""), "no --admin-token (OUTBOX_ADMIN_TOKEN) is set")
	require.ErrorContains(t, admin.CheckAddr(":8080", ""), "reachable from other hosts")
	require.NoError(t, admin.CheckAddr("0.0.0.0:8080", "tok"))
	require.NoError(t, admin.CheckAddr("127.0.0.1:8080", ""))
	require.NoError(t, admin.CheckAddr("[::1]:8080", ""))
	require.NoError(t, admin.CheckAddr("localhost:8080", ""))
	_, err := admin.Start(context.Background(), admin.Config{Addr: "0.0.0.0:0"})
	require.ErrorContains(t, err, "set a token, or listen on 127.0.0.1")
}

// Trip, list and reset a topic whose name holds quotes and semicolons: it is
// data, never SQL.
func TestTopicsTripListReset(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	topic := `orders'; DROP TABLE outbox; --"`
	path := "/topics/" + url.PathEscape(topic)
	code, body := b.call(t, "POST", path+"/trip", "", `{"reason":"maintenance"}`)
	require.Equal(t, 200, code, "%v", body)
	require.Equal(t, topic, body["topic"])
	require.Equal(t, "tripped", body["state"])
	require.Equal(t, "closed", body["previous_state"], "the answer says what changed")

	code, body = b.call(t, "GET", "/topics/tripped", "", "")
	require.Equal(t, 200, code)
	list := body["tripped"].([]any)
	require.Len(t, list, 1)
	st := list[0].(map[string]any)
	require.Equal(t, topic, st["topic"])
	require.Equal(t, float64(10), st["cooldown_ticks_left"])
	require.Equal(t, float64(1), st["trips"])
	require.Equal(t, "maintenance", st["last_error"])
	require.NotEmpty(t, st["tripped_at"])

	code, body = b.call(t, "POST", path+"/reset", "", "")
	require.Equal(t, 200, code)
	require.Equal(t, "closed", body["state"])
	require.Equal(t, "tripped", body["previous_state"])
	_, body = b.call(t, "GET", "/topics/tripped", "", "")
	require.Empty(t, body["tripped"])
	require.Len(t, readOutbox(t, b.tbl), 0, "the table is still there, and empty")

	code, body = b.call(t, "POST", path+"/trip", "", `{not json`)
	require.Equal(t, 400, code)
	require.Contains(t, body["error"], "not JSON")
}

func readOutbox(t *testing.T, tbl outbox.Table) []int64 {
	rows, err := dbtest.Pool(t).Query(context.Background(), "SELECT id FROM "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize())
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

func TestBreakerState(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	code, body := b.call(t, "GET", "/breaker", "", "")
	require.Equal(t, 200, code)
	require.Equal(t, "closed", body["state"])
	require.Equal(t, float64(0), body["state_value"])
	require.Contains(t, body["counts"], "consecutive_failures")
}

func TestDeadLettersListReplayPurge(t *testing.T) {
	t.Parallel()
	b := setup(t, "")
	code, body := b.call(t, "GET", "/dlq?topic=orders", "", "")
	require.Equal(t, 200, code)
	list := body["dead_letters"].([]any)
	require.Len(t, list, 2)
	raw, _ := json.Marshal(body)
	require.NotContains(t, string(raw), "payload", "no payload unless asked")
	_, body = b.call(t, "GET", "/dlq?show_payload=true&id=3", "", "")
	require.Len(t, body["dead_letters"].([]any), 1)
	require.Contains(t, fmt.Sprint(body), "U0VDUkVULTM=") // base64 of SECRET-3

	for _, bad := range []string{"/dlq?limit=0", "/dlq?since=yesterday", "/dlq?id=x"} {
		code, _ = b.call(t, "GET", bad, "", "")
		require.Equal(t, 400, code, bad)
	}

	code, body = b.call(t, "POST", "/dlq/replay", "", `{"ids":[1,99]}`)
	require.Equal(t, 400, code)
	require.Contains(t, body["error"], "no dead letters with ids [99]")
	code, body = b.call(t, "POST", "/dlq/replay", "", `{}`)
	require.Equal(t, 400, code)
	// A dry run counts what a replay would move, and moves nothing: the
	// number the console's confirmation shows.
	code, body = b.call(t, "POST", "/dlq/replay", "", `{"topic":"orders","dry_run":true}`)
	require.Equal(t, 200, code, "%v", body)
	require.Equal(t, float64(2), body["replayed"])
	require.Equal(t, true, body["dry_run"])
	require.Empty(t, readOutbox(t, b.tbl))
	code, _ = b.call(t, "POST", "/dlq/replay", "", `{"dry_run":true}`)
	require.Equal(t, 400, code, "a count needs a filter too")
	code, body = b.call(t, "POST", "/dlq/replay", "", `{"ids":[1]}`)
	require.Equal(t, 200, code)
	require.Equal(t, float64(1), body["replayed"])
	require.Equal(t, false, body["dry_run"])
	require.Len(t, readOutbox(t, b.tbl), 1)

	code, body = b.call(t, "POST", "/dlq/purge", "", `{"topic":"invoices","dry_run":true}`)
	require.Equal(t, 200, code)
	require.Equal(t, float64(1), body["purged"])
	require.Equal(t, true, body["dry_run"])
	code, body = b.call(t, "POST", "/dlq/purge", "", `{"older_than":"720h"}`)
	require.Equal(t, 200, code)
	require.Equal(t, float64(0), body["purged"])
	code, _ = b.call(t, "POST", "/dlq/purge", "", `{"since":"1h"}`)
	require.Equal(t, 400, code)
	// The CLI's rule (outbox.CheckAge): a zero age selects nothing, it is
	// refused, and nothing is purged.
	code, body = b.call(t, "POST", "/dlq/purge", "", `{"older_than":"0s"}`)
	require.Equal(t, 400, code)
	require.Contains(t, body["error"], "older_than is 0s, which would select every dead letter or none")
	code, body = b.call(t, "POST", "/dlq/replay", "", `{"since":"0s"}`)
	require.Equal(t, 400, code)
	require.Contains(t, body["error"], "since is 0s")
	code, _ = b.call(t, "POST", "/dlq/purge", "", `{"unknown":1}`)
	require.Equal(t, 400, code)
	code, body = b.call(t, "POST", "/dlq/purge", "", `{"all":true}`)
	require.Equal(t, 200, code)
	require.Equal(t, float64(2), body["purged"])
}

func readDead(t *testing.T, tbl outbox.Table) []int64 {
	rows, err := dbtest.Pool(t).Query(context.Background(), "SELECT id FROM "+pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize())
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// What the mux itself refuses answers in JSON too: an unknown path 404, a
// method a route does not take 405 with Allow.
func TestUnknownPathsAndMethodsAnswerJSON(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	code, body := b.call(t, http.MethodGet, "/no/such/thing", "tok", "")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body["error"], "no endpoint GET /no/such/thing")
	code, body = b.call(t, http.MethodPost, "/breaker", "tok", "")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.Contains(t, body["error"], "/breaker does not take POST: use GET")
	code, body = b.call(t, http.MethodDelete, "/topics/orders/reset", "tok", "")
	require.Equal(t, http.StatusMethodNotAllowed, code)
	require.Contains(t, body["error"], "use POST")
}

// Every change an operator makes is logged at info: the action, what it
// touched, and where the call came from.
func TestOperatorChangesAreAudited(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/topics/orders/trip", `{"reason":"maintenance window"}`},
		{http.MethodPost, "/topics/orders/reset", ""},
		{http.MethodPost, "/dlq/replay", `{"topic":"invoices","since":"720h"}`},
		{http.MethodPost, "/dlq/purge", `{"topic":"orders","dry_run":true}`},
		{http.MethodPost, "/dlq/purge", `{"topic":"orders"}`},
		{http.MethodGet, "/dlq", ""},
	} {
		code, body := b.call(t, c.method, c.path, "tok", c.body)
		require.Equal(t, http.StatusOK, code, "%s %s: %v", c.method, c.path, body)
	}
	var audits []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.log.String()), "\n") {
		var l map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &l), line)
		if l["msg"] == "admin action" {
			require.Equal(t, "INFO", l["level"])
			require.NotEmpty(t, l["remote"])
			require.Equal(t, "Go-http-client/1.1", l["user_agent"])
			audits = append(audits, l)
		}
	}
	require.Len(t, audits, 4, "trip, reset, replay and the purge that was not a dry run: %v", audits)
	require.Equal(t, "topic trip", audits[0]["action"])
	require.Equal(t, "orders", audits[0]["topic"])
	require.Equal(t, "maintenance window", audits[0]["reason"])
	require.Equal(t, "topic reset", audits[1]["action"])
	require.Equal(t, "dead letters replay", audits[2]["action"])
	require.Equal(t, 1.0, audits[2]["count"])
	require.Equal(t, "invoices", audits[2]["topic"])
	require.Equal(t, "720h", audits[2]["since"], "the selection's time, too")
	require.Equal(t, "dead letters purge", audits[3]["action"])
	require.Equal(t, 2.0, audits[3]["count"])
}

// The broker breaker can be tripped by hand, with a reason, and reset; both
// are audited.
func TestBrokerBreakerTripAndReset(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	code, body := b.call(t, http.MethodPost, "/breaker/trip", "tok", `{"reason":"broker failover at 03:00"}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "open", body["state"])
	require.Equal(t, "closed", body["previous_state"])
	require.Equal(t, "broker failover at 03:00", body["tripped_by_hand"])
	require.Equal(t, breaker.DependencyOpen, b.dep.State())
	_, body = b.call(t, http.MethodGet, "/breaker", "tok", "")
	require.Equal(t, "broker failover at 03:00", body["tripped_by_hand"])

	code, body = b.call(t, http.MethodPost, "/breaker/trip", "tok", `{"reason":`)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body["error"], "not JSON")

	code, body = b.call(t, http.MethodPost, "/breaker/reset", "tok", "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "closed", body["state"])
	require.Equal(t, "open", body["previous_state"])
	require.NotContains(t, body, "tripped_by_hand")
	require.Equal(t, breaker.DependencyClosed, b.dep.State())

	code, _ = b.call(t, http.MethodPost, "/breaker/reset", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, b.log.String(), `"action":"broker breaker trip","remote":`)
	require.Contains(t, b.log.String(), `"action":"broker breaker reset"`)
}

// GET /status: each topic with outstanding rows or a breaker not closed, the
// broker breaker, and the dead letters by topic and reason, in one answer.
func TestStatusShowsTopicsBreakersAndDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	w, err := outbox.NewWriter(b.tbl)
	require.NoError(t, err)
	require.NoError(t, w.Write(context.Background(), dbtest.Pool(t),
		outbox.Message{Topic: "payments", Payload: []byte("p1")}, outbox.Message{Topic: "payments", Payload: []byte("p2")},
		outbox.Message{Topic: "<img src=x onerror=alert(1)>", Payload: []byte("x")}))
	b.topics.Trip("shipping", "no route to the warehouse")

	code, body := b.call(t, http.MethodGet, "/status", "tok", "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	topics := body["topics"].([]any)
	// orders and invoices have no row left, but this process dead-lettered
	// theirs in the last minute.
	require.Len(t, topics, 5)
	byName := map[string]map[string]any{}
	for _, x := range topics {
		m := x.(map[string]any)
		byName[m["topic"].(string)] = m
	}
	require.Equal(t, 2.0, byName["payments"]["outstanding"])
	require.Equal(t, "closed", byName["payments"]["state"])
	require.GreaterOrEqual(t, byName["payments"]["oldest_age_seconds"], 0.0)
	require.Equal(t, 1.0, byName["<img src=x onerror=alert(1)>"]["outstanding"])
	require.Equal(t, "tripped", byName["shipping"]["state"])
	require.Equal(t, 0.0, byName["shipping"]["outstanding"])
	require.Equal(t, "no route to the warehouse", byName["shipping"]["last_error"])
	require.Equal(t, 0.0, byName["orders"]["outstanding"])
	require.Equal(t, 2.0, byName["orders"]["dead_lettered_last_minute"])
	require.Equal(t, 0.0, byName["orders"]["dispatched_last_minute"])
	require.Equal(t, 1.0, byName["invoices"]["dead_lettered_last_minute"])
	require.Equal(t, 0.0, byName["payments"]["dispatched_last_minute"])
	require.Equal(t, "closed", body["broker_breaker"].(map[string]any)["state"])
	dead := body["dead_letters"].(map[string]any)
	require.Equal(t, 3.0, dead["total"])
	groups := dead["groups"].([]any)
	require.Len(t, groups, 2)
	require.Equal(t, "invoices", groups[0].(map[string]any)["topic"])
	require.Equal(t, 1.0, groups[0].(map[string]any)["count"])
	require.Equal(t, "orders", groups[1].(map[string]any)["topic"])
	require.Equal(t, "invalid_message", groups[1].(map[string]any)["reason"])
	require.Equal(t, 2.0, groups[1].(map[string]any)["count"])
	require.NotContains(t, fmt.Sprint(body), "SECRET", "no payload in the status")

	// Within StatusCacheFor (an hour here) the backlog comes from the cache;
	// the breakers are read afresh.
	require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: "payments", Payload: []byte("p3")}))
	b.topics.Trip("billing", "by hand")
	_, again := b.call(t, http.MethodGet, "/status", "tok", "")
	require.Equal(t, body["backlog_read_at"], again["backlog_read_at"])
	states := map[string]string{}
	for _, x := range again["topics"].([]any) {
		m := x.(map[string]any)
		states[m["topic"].(string)] = m["state"].(string)
		if m["topic"] == "payments" {
			require.Equal(t, 2.0, m["outstanding"], "from the cache")
		}
	}
	require.Equal(t, "tripped", states["billing"], "breakers are current")

	code, _ = b.call(t, http.MethodGet, "/status", "", "")
	require.Equal(t, http.StatusUnauthorized, code)
}

// Every answer, success or error, carries headers that keep browsers from
// framing it, sniffing it, running it or caching it.
func TestEveryAnswerCarriesTheSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	for _, c := range []struct{ method, path, token string }{
		{http.MethodGet, "/healthz", ""}, {http.MethodGet, "/status", "tok"}, {http.MethodGet, "/status", ""},
		{http.MethodGet, "/nope", "tok"}, {http.MethodPut, "/breaker", "tok"}, {http.MethodGet, "/openapi.json", ""},
	} {
		req, err := http.NewRequest(c.method, b.srv.URL+c.path, nil)
		require.NoError(t, err)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
			"Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'", "Cache-Control": "no-store"} {
			require.Equal(t, v, resp.Header.Get(k), "%s %s: %s", c.method, c.path, k)
		}
	}
}

// pageAll reads every dead letter through GET /dlq, limit a page, following
// next_cursor, and returns their ids; rows is how many there are (a page
// more than they fill fails the test).
func pageAll(t *testing.T, b *bundle, limit, rows int) []float64 {
	t.Helper()
	var ids []float64
	path := fmt.Sprintf("/dlq?limit=%d", limit)
	for pages := 0; ; pages++ {
		require.Less(t, pages, (rows+limit-1)/limit+1, "%d dead letters in pages of %d", rows, limit)
		code, body := b.call(t, http.MethodGet, path, "tok", "")
		require.Equal(t, http.StatusOK, code, "%v", body)
		for _, x := range body["dead_letters"].([]any) {
			ids = append(ids, x.(map[string]any)["id"].(float64))
		}
		next, ok := body["next_cursor"].(string)
		if !ok {
			return ids
		}
		path = fmt.Sprintf("/dlq?limit=%d&cursor=%s", limit, url.QueryEscape(next))
	}
}

// The dead-letter list pages with a cursor: each page starts after the last
// row of the one before, so every dead letter is seen once, newest first.
func TestDeadLettersPageWithACursor(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	ids := pageAll(t, b, 2, 3)
	require.Len(t, ids, 3)
	require.ElementsMatch(t, []float64{1, 2, 3}, ids, "each once")

	code, body := b.call(t, http.MethodGet, "/dlq?cursor=yesterday", "tok", "")
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body["error"], "next_cursor")
}

// The console is served at / with --admin-ui, under a policy that runs only
// its own script and style; its script puts text from rows in the page as
// text only. Without --admin-ui, / is not served.
func TestConsoleIsServedUnderAStrictPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok", func(c *admin.Config) { c.UI = true })
	get := func(path string) (*http.Response, string) {
		resp, err := http.Get(b.srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(raw)
	}
	resp, html := get("/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "form-action 'none'", "frame-ancestors 'none'"} {
		require.Contains(t, csp, want)
	}
	require.NotContains(t, csp, "unsafe-inline")
	require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
	require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	require.Contains(t, html, `<script src="ui/app.js" defer></script>`)
	require.Equal(t, 1, strings.Count(html, "<script"), "no inline script")
	require.NotContains(t, html, "style=", "no inline style")

	resp, js := get("/ui/app.js")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/javascript; charset=utf-8", resp.Header.Get("Content-Type"))
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
		require.NotContains(t, js, sink, "the script never turns text into HTML")
	}
	require.Contains(t, js, "sessionStorage")
	require.NotContains(t, js, "localStorage")
	resp, _ = get("/ui/style.css")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/css; charset=utf-8", resp.Header.Get("Content-Type"))

	plain := setup(t, "tok")
	code, body := plain.call(t, http.MethodGet, "/", "tok", "")
	require.Equal(t, http.StatusNotFound, code, "%v", body)
}

// An admin API given no broker breaker (a library user's choice) says so: its status
// shows "none", and a trip or reset is a 404 that says why, changing nothing.
func TestNoBrokerBreaker(t *testing.T) {
	t.Parallel()
	b := setup(t, "", func(c *admin.Config) { c.Dependency = nil })
	code, body := b.call(t, http.MethodGet, "/status", "", "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, "none", body["broker_breaker"].(map[string]any)["state"])
	code, body = b.call(t, http.MethodGet, "/breaker", "", "")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "none", body["state"])
	for _, path := range []string{"/breaker/trip", "/breaker/reset"} {
		code, body = b.call(t, http.MethodPost, path, "", `{"reason":"x"}`)
		require.Equal(t, http.StatusNotFound, code, path)
		require.Equal(t, "this sweeper has no broker breaker", body["error"], path)
	}
	require.NotContains(t, b.log.String(), "admin action", "nothing changed, nothing audited")
}

// GET /status says ok while nothing is wrong, and degraded with a reason for
// each of: the broker breaker open, topics tripped, dead letters above the
// threshold.
func TestStatusSaysDegradedWithItsReasons(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok", func(c *admin.Config) { c.DegradedDeadLetters, c.StatusCacheFor = 3, time.Nanosecond })
	health := func() (string, []string) {
		code, body := b.call(t, http.MethodGet, "/status", "tok", "")
		require.Equal(t, http.StatusOK, code, "%v", body)
		h := body["health"].(map[string]any)
		reasons := []string{}
		for _, r := range h["reasons"].([]any) {
			reasons = append(reasons, r.(string))
		}
		return h["status"].(string), reasons
	}
	status, reasons := health()
	require.Equal(t, "ok", status, "3 dead letters, not more than 3")
	require.Empty(t, reasons)

	b.topics.Trip("shipping", "no route")
	b.dep.Trip("broker maintenance")
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		`INSERT INTO %s (id, message_id, topic, payload, created_at, reason) VALUES (100, gen_random_uuid(), 'x', '', now(), 'expired')`,
		b.tbl.DeadLetterIdent()))
	require.NoError(t, err)
	status, reasons = health()
	require.Equal(t, "degraded", status)
	require.Len(t, reasons, 3, "%q", reasons)
	require.Contains(t, reasons[0], "broker circuit breaker was tripped by hand (broker maintenance)")
	require.Equal(t, `1 topics tripped or half-open: "shipping"`, reasons[1])
	require.Equal(t, "4 dead letters, more than --degraded-dead-letters (3)", reasons[2])
}

// /healthz fails while a sweep is blocked (here in a producer's send that
// ignores its context) with no progress for more than --stall-ticks ticks and
// the floor the send timeout sets, says so, and recovers once the sweep goes
// on: Kubernetes restarts a wedged process. (A lock held on the outbox no
// longer wedges a sweep: its statements give up on it, and the sweep fails.)
func TestHealthzFailsWhileASweepIsBlocked(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	// The shortest send timeout makes the floor of a stall (twice the send
	// timeout plus 5s) about 10s.
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, dbtest.Pool(t), outbox.Message{Topic: "orders", Payload: []byte("x")}))
	release := make(chan struct{})
	prod := memory.New(memory.Config{})
	prod.SetSendFunc(func(context.Context, producer.Batch) error { <-release; return nil })
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod,
		outbox.Config{Table: tbl, Tick: 20 * time.Millisecond, DisableNotify: true, SendTimeout: time.Millisecond})
	require.NoError(t, err)
	srv := httptest.NewServer(admin.Handler(admin.Config{Pool: dbtest.Pool(t), Table: tbl, Topics: s.TopicBreaker(),
		Stalled: func(now time.Time) (outbox.Stall, bool) { return s.Stalled(now, 3) }}))
	defer srv.Close()
	healthz := func() (int, map[string]any) {
		resp, err := http.Get(srv.URL + "/healthz")
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, body
	}

	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	defer func() { stop(); <-ran }()
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	defer unblock() // before Run's end, which waits for the send

	var body map[string]any
	dbtest.Eventually(t, time.Minute, "/healthz says stalled", func() bool {
		var code int
		code, body = healthz()
		return code == http.StatusServiceUnavailable
	})
	require.Equal(t, "stalled", body["status"])
	require.Contains(t, body["reason"], "more than 3 ticks (--stall-ticks)")
	require.Contains(t, body["reason"], "no sweep has completed since the sweeper started")

	unblock()
	dbtest.Eventually(t, time.Minute, "/healthz is ok again once the sweep returns", func() bool {
		code, _ := healthz()
		return code == http.StatusOK
	})
}

// A sweeper whose database is gone fails every sweep, fast, and waits its
// backoff in between: that is not stalled (a restart would not bring the
// database back; /readyz says what is wrong), and /healthz stays ok.
func TestHealthzStaysOkWhileSweepsFailAgainstADeadDatabase(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	logs := &syncbuf.Buffer{}
	s, err := outbox.NewSweeper(pool, memory.New(memory.Config{}), outbox.Config{Tick: 10 * time.Millisecond, DisableNotify: true,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	require.NoError(t, err)
	// /healthz sees a clock past the stall floor (40 s at the default send
	// timeout), so that the wait between sweeps would count were it counted:
	// with the real clock the test ended long before the floor, and /healthz
	// said ok whatever Stalled did.
	later := outbox.StallFloor(outbox.SendTimeoutDefault) + time.Second
	srv := httptest.NewServer(admin.Handler(admin.Config{Pool: pool, Topics: s.TopicBreaker(),
		Stalled: func(now time.Time) (outbox.Stall, bool) { return s.Stalled(now.Add(later), 2) }}))
	defer srv.Close()
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(runCtx) }()
	defer func() { stop(); <-ran }()

	dbtest.Eventually(t, time.Minute, "two failed sweeps", func() bool {
		return strings.Count(logs.String(), "sweep failed; retrying") >= 2
	})
	// Between sweeps (a backoff of 0.5 s or more) /healthz is ok. A sweep in
	// progress at that later clock is stalled, rightly: it fails within a
	// millisecond here, so of three asks at least one falls between sweeps,
	// where a wait counted would answer 503 all three times.
	requireHealthyBetweenSweeps(t, srv.URL)
}

// requireHealthyBetweenSweeps asks /healthz three times, for a handler whose
// Stalled sees a clock past the stall floor: at least one ask falls between
// two quickly failing sweeps, where a wait counted as a stall would answer
// 503 all three times.
func requireHealthyBetweenSweeps(t *testing.T, url string) {
	t.Helper()
	var codes []int
	for range 3 {
		resp, err := http.Get(url + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	require.Contains(t, codes, http.StatusOK, "a backoff between failed sweeps is not a stall")
}

// While the database cannot be reached, every call that reads it answers 503
// at once, naming the database, with a Retry-After, and changes nothing: what
// an operator at 3 a.m. can act on, where a 500 sends them to the log. A
// statement that fails on a database that answers is still a 500.
func TestCallsOnAnUnreachableDatabaseAnswer503NamingIt(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/orders_db?connect_timeout=1")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	tbl := outbox.Table{}.WithDefaults()
	d, err := outbox.NewDeadLetters(pool, tbl)
	require.NoError(t, err)
	logs := &syncbuf.Buffer{}
	srv := httptest.NewServer(admin.Handler(admin.Config{Pool: pool, Table: tbl, Topics: breaker.New(breaker.Settings{}),
		DeadLetters: d, Logger: slog.New(slog.NewJSONHandler(logs, nil))}))
	defer srv.Close()
	for _, call := range []struct{ method, path, body string }{
		{"GET", "/status", ""},
		{"GET", "/dlq", ""},
		{"POST", "/dlq/replay", `{"topic":"orders"}`},
		{"POST", "/dlq/purge", `{"topic":"orders","dry_run":true}`},
	} {
		req, err := http.NewRequest(call.method, srv.URL+call.path, strings.NewReader(call.body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s %s: %s", call.method, call.path, raw)
		require.Contains(t, string(raw), `database \"orders_db\" is unreachable: nothing was read or changed`, "%s %s", call.method, call.path)
		require.Equal(t, "5", resp.Header.Get("Retry-After"))
	}
	require.Contains(t, logs.String(), "database unreachable")

	// A database that answers, a statement that fails: the table is not
	// there.
	missing := outbox.Table{Schema: "no_such_schema", Name: "outbox"}
	d, err = outbox.NewDeadLetters(dbtest.Pool(t), missing)
	require.NoError(t, err)
	srv2 := httptest.NewServer(admin.Handler(admin.Config{Pool: dbtest.Pool(t), Table: missing, Topics: breaker.New(breaker.Settings{}), DeadLetters: d}))
	defer srv2.Close()
	resp, err := http.Get(srv2.URL + "/dlq")
	require.NoError(t, err)
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%s", raw)
	require.Contains(t, string(raw), "internal error: see the sweeper's log")
}

func TestUnreachableTellsAnOutageFromAFailedStatement(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "57P01"}, true}, // admin_shutdown: the server stops
		{&pgconn.PgError{Code: "57P03"}, true}, // cannot_connect_now: it starts
		{&pgconn.PgError{Code: "08006"}, true}, // connection_failure
		{fmt.Errorf("read the backlog: %w", io.ErrUnexpectedEOF), true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{&pgconn.PgError{Code: "42P01"}, false}, // undefined_table
		{&pgconn.PgError{Code: "57014"}, false}, // query_canceled: a timeout, not an outage
		{context.Canceled, false},
		{fmt.Errorf("list dead letters: %w", context.DeadlineExceeded), false}, // a slow statement: no outage
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, false},
		{errors.New("something else"), false},
	} {
		require.Equal(t, c.want, admin.Unreachable(c.err), "%v", c.err)
	}

	// A server that accepts connections and never answers (hung, or a
	// failover in progress): pgx's connect error wraps the deadline, and is
	// an outage all the same.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	_, err = pgx.Connect(context.Background(), "postgres://postgres@"+silent.Addr().String()+"/postgres?sslmode=disable&connect_timeout=1")
	require.ErrorIs(t, err, context.DeadlineExceeded, "the control: the connect timed out")
	require.True(t, admin.Unreachable(err), "a connect timeout: %v", err)
}

// A change whose connection broke after its statement went may have been
// made: its 503 says to look before calling again, where a read's says to
// call again as it was.
func TestAChangeCutOffMidwaySaysItMayHaveBeenMade(t *testing.T) {
	t.Parallel()
	cut := fmt.Errorf("replay dead letters: %w", io.ErrUnexpectedEOF)
	for _, c := range []struct{ method, want string }{
		{http.MethodPost, "the change may or may not have been made: look (GET) before calling again"},
		{http.MethodGet, "nothing was read or changed; call again"},
	} {
		w := httptest.NewRecorder()
		admin.Internal(w, httptest.NewRequest(c.method, "/dlq/replay", nil), cut)
		require.Equal(t, http.StatusServiceUnavailable, w.Code, c.method)
		require.Contains(t, w.Body.String(), c.want, c.method)
	}
}

// A call whose statement waits on the database (here behind a lock another
// session holds) ends by the request timeout, 503 saying so, and a second
// call waiting for the first's read of the backlog ends by its own: neither
// holds its request, nor the relay's connection, for as long as the lock.
func TestACallTheDatabaseDoesNotAnswerEndsByTheRequestTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok", func(c *admin.Config) { c.RequestTimeout = 300 * time.Millisecond; c.StatusCacheFor = -1 })
	ctx := context.Background()
	defer dbtest.LockTables(t, b.tbl.DeadLetterIdent())()

	code, body := b.call(t, http.MethodGet, "/dlq", "tok", "")
	require.Equal(t, http.StatusServiceUnavailable, code, "%v", body)
	require.Contains(t, body["error"], "the database did not answer within 300ms")
	require.Contains(t, body["error"], "nothing was read or changed; call again")

	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range codes {
		wg.Go(func() { codes[i], _ = b.call(t, http.MethodGet, "/status", "tok", "") })
	}
	wg.Wait()
	require.Equal(t, []int{http.StatusServiceUnavailable, http.StatusServiceUnavailable}, codes)

	code, body = b.call(t, http.MethodPost, "/topics/orders/trip", "tok", `{"reason":"x"}`)
	require.Equal(t, http.StatusOK, code, "a change that needs no dead-letter table goes on: %v", body)

	// A purge or a replay is not bounded: one statement, all or nothing,
	// which a large table's would outlast; it ends with its caller.
	ctx2, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx2, http.MethodPost, b.srv.URL+"/dlq/purge", strings.NewReader(`{"all":true}`))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer tok")
	_, err = http.DefaultClient.Do(req)
	require.ErrorIs(t, err, context.DeadlineExceeded, "still waiting for the lock after the request timeout")
}

// Dead letters with an id of 0 or less (reason invalid_id: rows written so)
// are paged through, and read by id, like any other: a next_cursor of such a
// row ("…-0", "…--5") was refused as not one the API gave.
func TestDeadLettersWithNonPositiveIDsArePagedAndRead(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	_, err := dbtest.Pool(t).Exec(context.Background(), "INSERT INTO "+b.tbl.DeadLetterIdent()+
		" (id, message_id, topic, payload, created_at, reason, dead_lettered_at) "+
		"SELECT i, gen_random_uuid(), 'neg', '\\x00', now(), 'invalid_id', now() - interval '1 day' + i * interval '1 second' "+
		"FROM (VALUES (0), (-5)) AS v(i)")
	require.NoError(t, err)
	ids := pageAll(t, b, 1, 5)
	require.ElementsMatch(t, []float64{1, 2, 3, 0, -5}, ids, "each once")
	code, body := b.call(t, http.MethodGet, "/dlq?show_payload=true&limit=1&id=-5", "tok", "")
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Len(t, body["dead_letters"], 1)
}

// A purge waiting on the database ends when the relay stops (the server's
// requests end with it): it once held its connection, and the pool's close
// at shutdown, until the purge ended.
func TestAPurgeWaitingOnTheDatabaseEndsWithTheRelay(t *testing.T) {
	t.Parallel()
	var cfg admin.Config
	b := setup(t, "tok", func(c *admin.Config) { cfg = *c })
	ctx := context.Background()
	defer dbtest.LockTables(t, b.tbl.DeadLetterIdent())()

	cfg.Addr = "127.0.0.1:0"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.Addr = ln.Addr().String()
	require.NoError(t, ln.Close())
	relayCtx, stop := context.WithCancel(ctx)
	wait, err := admin.Start(relayCtx, cfg)
	require.NoError(t, err)
	answered := make(chan error, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, "http://"+cfg.Addr+"/dlq/purge", strings.NewReader(`{"all":true}`))
		if err != nil {
			answered <- err
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		answered <- err
	}()
	// The purge waits on the lock: held until the test ends, it cannot
	// finish; the relay stops.
	dbtest.Eventually(t, time.Minute, "the purge waiting on the lock", func() bool {
		var n int
		require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%"+b.tbl.DeadLetterName()+"%'").Scan(&n))
		return n > 0
	})
	stop()
	wait()
	select {
	case <-answered:
	case <-time.After(time.Minute):
		t.Fatal("the purge still holds its request after the relay stopped")
	}
	dbtest.Eventually(t, time.Minute, "its statement cancelled, the lock still held", func() bool {
		var n int
		require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%"+b.tbl.DeadLetterName()+"%'").Scan(&n))
		return n == 0
	})
}
