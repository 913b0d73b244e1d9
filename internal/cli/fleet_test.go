package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The flags of a relay of many outboxes refuse what cannot work, naming the
// flags, before anything connects.
func TestFleetFlagsRefuseWhatCannotWork(t *testing.T) {
	t.Parallel()
	empty := filepath.Join(t.TempDir(), "none.txt")
	require.NoError(t, os.WriteFile(empty, []byte("# no database yet\n\n"), 0o600))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--max-connections", "5"}, "--max-connections works with --schemas, --databases-file or --databases only"},
		{[]string{"run", "--destination", "{schema}.{topic}"}, "--destination works with --schemas, --databases-file or --databases only"},
		{[]string{"run", "--metrics-outboxes", "tenant_*"}, "--metrics-outboxes works with --schemas, --databases-file or --databases only"},
		{[]string{"run", "--schemas", "tenant_*", "--metrics-outboxes", "["}, `invalid pattern "[" for --metrics-outboxes`},
		{[]string{"run", "--schemas", "tenant_*", "--schema", "app"}, "--schema and --schemas both name the outboxes"},
		{[]string{"run", "--schemas", "tenant_*", "--notify=false"}, "--notify does not work with --schemas"},
		{[]string{"run", "--schemas", "tenant_*", "--redis-url", "http://x", "--admin-addr", ""}, `invalid value "http://x" for --redis-url`},
		{[]string{"run", "--schemas", "tenant_*", "--max-connections", "2"}, "--max-connections is 2: it must be at least 3"},
		{[]string{"run", "--awake-rate", "20"}, "--awake-rate works with --schemas, --databases-file or --databases only"},
		{[]string{"run", "--schemas", "tenant_*", "--awake-rate", "0"}, "--awake-rate is 0: it must be at least 1"},
		{[]string{"run", "--schemas", "tenant_*", "--destination", "{tenant}.{topic}"}, "names {tenant}: the placeholders are {database}, {schema} and {topic}"},
		{[]string{"run", "--schemas", "tenant_*", "--destination", "{schema}"}, "does not contain {topic}"},
		{[]string{"run", "--schemas", "[", "--admin-addr", ""}, "it is not a valid pattern"},
		{[]string{"run", "--databases", "postgres://x/y", "--schemas", "[", "--admin-addr", ""}, "it is not a valid pattern"},
		// The topic breaker's flags are checked once, not at each tenant
		// found, which would leave every tenant out and the process running.
		{[]string{"run", "--schemas", "tenant_*", "--topic-failure-threshold", "0", "--admin-addr", ""}, "--topic-failure-threshold is 0: it must be at least 1"},
		{[]string{"run", "--databases", "postgres://x/y", "--topic-cooldown", "orders=0", "--admin-addr", ""}, `invalid entry "orders=0" in --topic-cooldown`},
		{[]string{"run", "--databases-file", empty, "--database-url", "postgres://x/y"}, "--database-url and --databases-file both name databases"},
		{[]string{"run", "--databases-file", empty, "--admin-addr", ""}, "lists no database: write one connection URL a line"},
		{[]string{"run", "--databases-file", empty, "--schema", "app"}, "--schema names one outbox, and a list of databases relays every schema holding the table: give --schemas app instead"},
		{[]string{"run", "--databases", "postgres://x/y", "--database-url", "postgres://x/z"}, "--database-url and --databases both name databases"},
		{[]string{"run", "--databases", "postgres://x/y", "--databases-file", empty}, "--databases and --databases-file both name databases"},
		{[]string{"run", "--databases", " \n ", "--admin-addr", ""}, "--databases: it lists no database"},
		{[]string{"run", "--databases", "dbname=app host=127.0.0.1 password=s3cret", "--admin-addr", ""},
			`--databases: it lists "dbname=…", which is not a postgres:// URL: the list is split at spaces`},
		{[]string{"migrate", "--schemas", "["}, `invalid pattern "[" for --schemas`},
	} {
		code, _, stderr := runMain(t, noEnv, c.args...)
		require.Equal(t, ExitUsage, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.want, "%v", c.args)
		require.NotContains(t, stderr, "s3cret", "%v", c.args)
	}
}

func TestReadDatabasesFile(t *testing.T) {
	t.Parallel()
	name := filepath.Join(t.TempDir(), "tenants.txt")
	require.NoError(t, os.WriteFile(name, []byte("# tenants\npostgres://a/t1\n\n  postgres://b/t2  \n#postgres://c/t3\n"), 0o600))
	urls, err := readDatabasesFile(name)
	require.NoError(t, err)
	require.Equal(t, []string{"postgres://a/t1", "postgres://b/t2"}, urls)
	_, err = readDatabasesFile(filepath.Join(t.TempDir(), "missing.txt"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// --outbox sends sweeper topics and sweeper breaker to that outbox's API in a
// relay of many.
func TestOutboxFlagAddressesATenantsAPI(t *testing.T) {
	t.Parallel()
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	var out, errOut bytes.Buffer
	for _, args := range [][]string{
		{"topics", "reset", "orders", "--admin-url", srv.URL, "--outbox", "tenant_0001", "--json"},
		{"breaker", "status", "--admin-url", srv.URL, "--outbox", "shop.tenant_0002", "--json"},
	} {
		code := Main(context.Background(), args, &out, &errOut, noEnv)
		require.Equal(t, 0, code, "%v: %s", args, errOut.String())
	}
	require.Equal(t, []string{"POST /outboxes/tenant_0001/topics/orders/reset", "GET /outboxes/shop.tenant_0002/breaker"}, got)
}
