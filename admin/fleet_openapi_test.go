package admin_test

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
)

// fleetServer serves a fleet's API over one outbox, the one setup makes
// (three dead letters, two outstanding rows none), with token tok.
func fleetServer(t *testing.T) *httptest.Server {
	t.Helper()
	var cfg admin.Config
	setup(t, "tok", func(c *admin.Config) { cfg = *c })
	srv := httptest.NewServer(admin.FleetHandler(admin.FleetConfig{
		Base:      cfg,
		TableName: cfg.Table.Name,
		Outboxes: func() []admin.FleetOutbox {
			return []admin.FleetOutbox{{Config: cfg}}
		},
	}))
	t.Cleanup(srv.Close)
	return srv
}

func fleetCall(t *testing.T, srv *httptest.Server, path, token string) (int, []byte) {
	t.Helper()
	return fleetRequest(t, srv, http.MethodGet, path, token, "")
}

// fleetRequest calls srv; a POST carries body as JSON.
func fleetRequest(t *testing.T, srv *httptest.Server, method, path, token, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, raw
}

// A fleet's description documents every route its API serves, and no
// other, and what its handlers answer validates against it, every object
// closed (as the single outbox's does: TestOpenAPISchemasMatchWhatTheHandlersAnswer).
func TestFleetOpenAPIDescribesItsAPI(t *testing.T) {
	t.Parallel()
	srv := fleetServer(t)
	code, raw := fleetCall(t, srv, "/openapi.json", "")
	require.Equal(t, http.StatusOK, code)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.Equal(t, "3.1.0", doc["openapi"])

	documented := documentedRoutes(doc)
	served := admin.FleetRoutePatterns()
	slices.Sort(documented)
	slices.Sort(served)
	require.Equal(t, served, documented)

	closeObjects(doc)
	closed, err := json.Marshal(doc)
	require.NoError(t, err)
	parsed, err := jsonschema.UnmarshalJSON(bytes.NewReader(closed))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("openapi_fleet.json", parsed))
	for _, tc := range []struct {
		path, spec, token string
		status            int
	}{
		{"/healthz", "/healthz", "", 200},
		{"/readyz", "/readyz", "", 200},
		{"/outboxes", "/outboxes", "tok", 200},
		{"/outboxes?limit=0", "/outboxes", "tok", 400},
		{"/outboxes", "/outboxes", "", 401},
		{"/outboxes/no_such_schema/status", "/outboxes/{name}/", "tok", 404},
		{"/breaker", "/breaker", "tok", 200},
		{"/breaker", "/breaker", "", 401},
	} {
		code, body := fleetCall(t, srv, tc.path, tc.token)
		require.Equal(t, tc.status, code, "GET %s: %s", tc.path, body)
		sch := answerSchema(t, c, closed, "openapi_fleet.json", "GET", tc.spec, tc.status)
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
		require.NoError(t, err)
		require.NoError(t, sch.Validate(v), "GET %s answered %d %s", tc.path, code, body)
	}

	// The outbox is listed with what the schema requires, and its own API
	// answers under its path.
	_, raw = fleetCall(t, srv, "/outboxes", "tok")
	var list struct {
		Outboxes []struct{ Path string } `json:"outboxes"`
		Total    int                     `json:"total"`
	}
	require.NoError(t, json.Unmarshal(raw, &list))
	require.Equal(t, 1, list.Total)
	require.Len(t, list.Outboxes, 1)
	code, _ = fleetCall(t, srv, list.Outboxes[0].Path+"status", "tok")
	require.Equal(t, http.StatusOK, code)
}

// A fleet serves Go's profiles at its root, behind the token, as a relay of
// one outbox does: profiling a thousand tenants' relay should not need a
// tenant's name in the path.
func TestFleetServesProfilesBehindTheToken(t *testing.T) {
	t.Parallel()
	srv := fleetServer(t)
	paths := []string{"/debug/pprof/heap", "/debug/pprof/goroutine?debug=1"}
	for _, p := range admin.FleetRoutePatterns() {
		if path, ok := strings.CutPrefix(p, "GET /debug/pprof"); ok {
			paths = append(paths, "/debug/pprof"+path)
		}
	}
	require.Len(t, paths, 7, "the five routes and two profiles under the index")
	for _, path := range paths {
		for _, tok := range []string{"", "wrong"} {
			code, raw := fleetCall(t, srv, path, tok)
			require.Equal(t, http.StatusUnauthorized, code, "%s with token %q", path, tok)
			require.Contains(t, string(raw), "bearer token")
		}
	}
	code, raw := fleetCall(t, srv, "/debug/pprof/goroutine?debug=1", "tok")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(raw), "goroutine profile:")
	code, raw = fleetCall(t, srv, "/debug/pprof/", "tok")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, string(raw), "goroutine", "the index lists the profiles")

	// The fleet's description of the routes is a copy of the outbox's:
	// held to it, so that the two do not drift.
	profiles := func(path string) map[string]any {
		code, raw := fleetCall(t, srv, path, "tok")
		require.Equal(t, http.StatusOK, code, path)
		var doc struct{ Paths map[string]any }
		require.NoError(t, json.Unmarshal(raw, &doc))
		maps.DeleteFunc(doc.Paths, func(p string, _ any) bool { return !strings.HasPrefix(p, "/debug/pprof") })
		return doc.Paths
	}
	fleetDoc := profiles("/openapi.json")
	require.Len(t, fleetDoc, 5)
	_, raw = fleetCall(t, srv, "/outboxes", "tok")
	var list struct{ Outboxes []struct{ Path string } }
	require.NoError(t, json.Unmarshal(raw, &list))
	require.Len(t, list.Outboxes, 1)
	require.Equal(t, profiles(list.Outboxes[0].Path+"openapi.json"), fleetDoc)
}

// An endpoint of one outbox asked of a relay of many at its root (a
// `sweeper topics list` without --outbox) is answered with where it is.
func TestFleetSaysWhereAnOutboxsEndpointsAre(t *testing.T) {
	t.Parallel()
	srv := fleetServer(t)
	code, raw := fleetCall(t, srv, "/topics/tripped", "tok")
	require.Equal(t, http.StatusNotFound, code)
	var body struct{ Error string }
	require.NoError(t, json.Unmarshal(raw, &body))
	require.Contains(t, body.Error, "no endpoint GET /topics/tripped")
	require.Contains(t, body.Error, "each one's endpoints under /outboxes/{name}/")
	require.Contains(t, body.Error, "--outbox NAME")

	// Under an outbox's path, a path no endpoint serves is that outbox's
	// API's answer, which has no other place to point to.
	_, raw = fleetCall(t, srv, "/outboxes", "tok")
	var list struct {
		Outboxes []struct{ Path string } `json:"outboxes"`
	}
	require.NoError(t, json.Unmarshal(raw, &list))
	require.Len(t, list.Outboxes, 1)
	code, raw = fleetCall(t, srv, list.Outboxes[0].Path+"no/such/path", "tok")
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, string(raw), "no endpoint GET /no/such/path")
	require.NotContains(t, string(raw), "--outbox")
}

// The broker breaker is one for the relay, so the fleet serves it at its root
// too: `sweeper breaker trip` before planned broker work needs no tenant's
// name. A trip there is the one every outbox's API shows.
func TestFleetServesTheBrokerBreakerAtItsRoot(t *testing.T) {
	t.Parallel()
	srv := fleetServer(t)
	post := func(path, token, body string) (int, string) {
		code, raw := fleetRequest(t, srv, http.MethodPost, path, token, body)
		return code, string(raw)
	}
	state := func(path string) string {
		code, raw := fleetCall(t, srv, path, "tok")
		require.Equal(t, http.StatusOK, code, string(raw))
		var b struct{ State string }
		require.NoError(t, json.Unmarshal(raw, &b))
		return b.State
	}
	code, body := post("/breaker/trip", "", `{"reason":"failover"}`)
	require.Equal(t, http.StatusUnauthorized, code, body)
	require.Equal(t, "closed", state("/breaker"))

	code, body = post("/breaker/trip", "tok", `{"reason":"broker failover at 03:00"}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "broker failover at 03:00")
	_, raw := fleetCall(t, srv, "/outboxes", "tok")
	var list struct {
		Outboxes []struct{ Path string } `json:"outboxes"`
	}
	require.NoError(t, json.Unmarshal(raw, &list))
	require.Len(t, list.Outboxes, 1)
	require.Equal(t, "open", state(list.Outboxes[0].Path+"breaker"), "the outbox's API shows the same breaker")

	code, body = post("/breaker/reset", "tok", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "closed", state("/breaker"))
}
