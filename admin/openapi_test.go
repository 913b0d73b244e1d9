package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// openAPI fetches /openapi.json (no token needed) and returns it parsed.
func openAPI(t *testing.T, b *bundle) map[string]any {
	t.Helper()
	resp, err := http.Get(b.srv.URL + "/openapi.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.Equal(t, "3.1.0", doc["openapi"])
	return doc
}

// Every route the mux serves is documented, and nothing is documented that
// it does not serve.
func TestOpenAPIDescribesEveryRouteAndNoOther(t *testing.T) {
	t.Parallel()
	documented := documentedRoutes(openAPI(t, setup(t, "tok")))
	served := admin.RoutePatterns()
	slices.Sort(documented)
	slices.Sort(served)
	require.Equal(t, served, documented)
}

// What each handler answers validates against the schema openapi.json gives
// for that path, method and status.
func TestOpenAPISchemasMatchWhatTheHandlersAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, "tok")
	c, raw := closedSpec(t, b)

	b.topics.Trip("shipping", "by hand")
	for _, tc := range []struct {
		method, path, spec, token, body string
		status                          int
	}{
		{"GET", "/healthz", "/healthz", "", "", 200},
		{"GET", "/readyz", "/readyz", "", "", 200},
		{"GET", "/status", "/status", "tok", "", 200},
		{"GET", "/status", "/status", "", "", 401},
		{"GET", "/breaker", "/breaker", "tok", "", 200},
		{"POST", "/breaker/trip", "/breaker/trip", "tok", `{"reason":"failover"}`, 200},
		{"POST", "/breaker/trip", "/breaker/trip", "tok", `{"reason":`, 400},
		{"POST", "/breaker/reset", "/breaker/reset", "tok", "", 200},
		{"GET", "/topics/tripped", "/topics/tripped", "tok", "", 200},
		{"POST", "/topics/orders/trip", "/topics/{topic}/trip", "tok", `{"reason":"x"}`, 200},
		{"POST", "/topics/orders/reset", "/topics/{topic}/reset", "tok", "", 200},
		{"POST", "/topics/trip", "/topics/trip", "tok", `{"topic":"..","reason":"x"}`, 200},
		{"POST", "/topics/reset", "/topics/reset", "tok", `{"topic":".."}`, 200},
		{"POST", "/topics/reset", "/topics/reset", "tok", `{}`, 400},
		{"POST", "/topics/%FF/reset", "/topics/{topic}/reset", "tok", "", 400},
		{"GET", "/dlq?limit=10", "/dlq", "tok", "", 200},
		{"GET", "/dlq?limit=1", "/dlq", "tok", "", 200}, // with a next_cursor
		{"GET", "/dlq?show_payload=true", "/dlq", "tok", "", 200},
		{"GET", "/dlq?limit=0", "/dlq", "tok", "", 400},
		{"POST", "/dlq/purge", "/dlq/purge", "tok", `{"all":true,"dry_run":true}`, 200},
		{"POST", "/dlq/replay", "/dlq/replay", "tok", `{"ids":[999999]}`, 400},
		{"POST", "/dlq/replay", "/dlq/replay", "tok", `{"topic":"orders","dry_run":true}`, 200},
		{"POST", "/dlq/replay", "/dlq/replay", "tok", `{"dry_run":true}`, 400},
		{"POST", "/dlq/replay", "/dlq/replay", "tok", `{"topic":"invoices"}`, 200},
	} {
		code, body := b.call(t, tc.method, tc.path, tc.token, tc.body)
		require.Equal(t, tc.status, code, "%s %s: %v", tc.method, tc.path, body)
		sch := answerSchema(t, c, raw, "openapi.json", tc.method, tc.spec, tc.status)
		got, err := json.Marshal(body)
		require.NoError(t, err)
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(got))
		require.NoError(t, err)
		require.NoError(t, sch.Validate(v), "%s %s answered %d %s", tc.method, tc.path, code, got)
	}
}

// closedSpec compiles the served description with every object closed: it
// lets clients meet fields it does not name (so that adding one is not a
// breaking change), but here every field a handler answers must be
// documented. It returns the compiler and the description it holds.
func closedSpec(t *testing.T, b *bundle) (*jsonschema.Compiler, []byte) {
	t.Helper()
	spec := openAPI(t, b)
	closeObjects(spec)
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("openapi.json", doc))
	return c, raw
}

// What GET /status answers of the gate, for a topic tripped, one backing off
// and an open broker breaker, validates against the description.
func TestOpenAPIDescribesTheGate(t *testing.T) {
	t.Parallel()
	dep := breaker.NewDependency(breaker.DependencyConfig{})
	t.Cleanup(func() { _ = dep.Close(context.Background()) })
	prod := memory.New(memory.Config{})
	prod.FailTopic("refused", producer.NewTopicError("topic_not_found", errors.New("no such queue")))
	prod.FailTopic("failing", errors.New("unclassified"))
	b, _ := gateBundle(t, prod, dep, "refused", "failing")
	dep.Trip("failover")
	c, _ := closedSpec(t, b)
	sch, err := c.Compile("openapi.json#/components/schemas/Status")
	require.NoError(t, err)
	code, body := b.call(t, "GET", "/status", "tok", "")
	require.Equal(t, 200, code, "%v", body)
	reasons := map[any]bool{}
	for _, e := range body["topics"].([]any) {
		if g, ok := e.(map[string]any)["gate"].(map[string]any); ok {
			reasons[g["reason"]] = true
		}
	}
	require.Equal(t, map[any]bool{"tripped": true, "backoff": true}, reasons, "both answers are validated")
	require.Equal(t, "broker_open", body["broker_breaker"].(map[string]any)["gate"])
	got, err := json.Marshal(body)
	require.NoError(t, err)
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(got))
	require.NoError(t, err)
	require.NoError(t, sch.Validate(v), "GET /status answered %s", got)
}

// closeObjects sets additionalProperties to false on every schema that lists
// properties and says nothing of others.
func closeObjects(v any) {
	switch x := v.(type) {
	case map[string]any:
		if _, ok := x["properties"].(map[string]any); ok {
			if _, set := x["additionalProperties"]; !set {
				x["additionalProperties"] = false
			}
		}
		for _, e := range x {
			closeObjects(e)
		}
	case []any:
		for _, e := range x {
			closeObjects(e)
		}
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// answerSchema compiles the schema that raw, added to c as resource, gives
// the JSON answer of method spec with status.
func answerSchema(t *testing.T, c *jsonschema.Compiler, raw []byte, resource, method, spec string, status int) *jsonschema.Schema {
	t.Helper()
	escape := func(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1") }
	m := strings.ToLower(method)
	ptr := resource + "#/paths/" + escape(spec) + "/" + m + "/responses/" + itoa(status)
	if ref, ok := lookup(t, raw, spec, m, itoa(status))["$ref"].(string); ok {
		ptr = resource + ref
	}
	sch, err := c.Compile(ptr + "/content/application~1json/schema")
	require.NoError(t, err, "%s %s %d is documented", method, spec, status)
	return sch
}

// documentedRoutes lists the "METHOD /path" of every operation doc names.
func documentedRoutes(doc map[string]any) []string {
	var out []string
	for path, ops := range doc["paths"].(map[string]any) {
		for method := range ops.(map[string]any) {
			if method != "parameters" {
				out = append(out, strings.ToUpper(method)+" "+path)
			}
		}
	}
	return out
}

// lookup returns the response object paths[path][method].responses[status].
func lookup(t *testing.T, raw []byte, path, method, status string) map[string]any {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"` // a path's parameters are an array
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	var op struct {
		Responses map[string]map[string]any `json:"responses"`
	}
	if m, ok := doc.Paths[path][method]; ok {
		require.NoError(t, json.Unmarshal(m, &op))
	}
	resp, ok := op.Responses[status]
	require.True(t, ok, "openapi.json documents %s %s %s", method, path, status)
	return resp
}
