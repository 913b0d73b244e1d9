// Package dbtest gives tests a real Postgres and an outbox of their own.
//
// The database is found, in order, through OUTBOX_TEST_DATABASE_URL, the local
// default (postgres@127.0.0.1:5432, as on the development machines and in CI), or
// a Postgres container started with testcontainers-go when a Docker engine is
// reachable. When none works the test fails with a message that says what to set:
// a test that needs the database is never skipped.
//
// Each call to [Table] creates a schema named outboxtest_<unix>_<pid>_<n> and
// migrates an outbox into it, so tests run in parallel without seeing each
// other's rows. Schemas are dropped at cleanup; ones left by a killed run are
// dropped by a later run once they are an hour old.
package dbtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"go.uber.org/goleak"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// EnvURL names the variable that points tests at a database.
const EnvURL = "OUTBOX_TEST_DATABASE_URL"

// LocalURL is the database the development machines and CI run.
const LocalURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

const schemaPrefix = "outboxtest_"

var (
	resolveOnce sync.Once
	resolvedURL string
	resolveErr  error
	container   testcontainers.Container

	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error

	schemaSeq atomic.Int64
	dropStale sync.Once
)

// URL returns the test database's URL, failing t when there is none.
func URL(t testing.TB) string {
	t.Helper()
	resolveOnce.Do(func() { resolvedURL, resolveErr = resolve() })
	if resolveErr != nil {
		t.Fatal(resolveErr)
	}
	return resolvedURL
}

func resolve() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if u := os.Getenv(EnvURL); u != "" {
		if err := ping(ctx, u); err != nil {
			return "", fmt.Errorf("%s=%q does not answer: %w (start that Postgres, or unset %s to use %s)", EnvURL, u, err, EnvURL, LocalURL)
		}
		return u, nil
	}
	localErr := ping(ctx, LocalURL)
	if localErr == nil {
		return LocalURL, nil
	}
	c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
		tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return "", fmt.Errorf("no Postgres for the tests: %s is unset, the local default %s does not answer (%v), and no container could be started (%v). "+
			"Start Postgres locally (`pg_ctlcluster 15 main start`, or `bash .ci/run`, which installs and starts it), or set %s",
			EnvURL, LocalURL, localErr, err, EnvURL)
	}
	container = c
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", fmt.Errorf("container Postgres: %w", err)
	}
	return u, nil
}

func ping(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// Pool returns a pool on the test database, shared by the package's tests and
// closed by [Main].
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	p, err := sharedPool()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func sharedPool() (*pgxpool.Pool, error) {
	resolveOnce.Do(func() { resolvedURL, resolveErr = resolve() })
	if resolveErr != nil {
		return nil, resolveErr
	}
	poolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(resolvedURL)
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 32
		pool, poolErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if poolErr != nil {
		return nil, fmt.Errorf("test pool: %w", poolErr)
	}
	return pool, nil
}

var (
	exampleMu      sync.Mutex
	exampleSchemas []string
)

// ExampleOutbox returns the shared pool and an outbox migrated into a schema
// of its own, for runnable examples, which have no testing.TB: it panics where
// a test would fail. [Run] drops the schemas after the package's tests.
func ExampleOutbox() (*pgxpool.Pool, outbox.Table) {
	p, err := sharedPool()
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	tbl := outbox.Table{Schema: fmt.Sprintf("%s%d_%d_x%d", schemaPrefix, time.Now().Unix(), os.Getpid(), schemaSeq.Add(1)), Name: "outbox"}
	exampleMu.Lock()
	exampleSchemas = append(exampleSchemas, tbl.Schema)
	exampleMu.Unlock()
	conn, err := p.Acquire(ctx)
	if err != nil {
		panic(err)
	}
	defer conn.Release()
	if _, err := outbox.Migrate(ctx, conn.Conn(), tbl); err != nil {
		panic(fmt.Sprintf("migrate example schema %s: %v", tbl.Schema, err))
	}
	return p, tbl
}

// NewPool returns a pool of its own, closed at cleanup, for tests that must not
// share connections (two sweepers, a dropped connection).
func NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return newPool(t, maxConns, "")
}

// NamedPool is NewPool with 6 connections whose sessions carry application_name
// name, so a test can find its sweeper's sessions in pg_stat_activity among
// those of the tests running alongside.
func NamedPool(t testing.TB, name string) *pgxpool.Pool {
	t.Helper()
	return newPool(t, 6, name)
}

// NamedURL returns the connection URL u with application_name name: for a
// binary a test starts, whose sessions it then finds in pg_stat_activity
// among those of the tests running alongside, as NamedPool's.
func NamedURL(t testing.TB, u, name string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatalf("name the sessions of %q: %v", u, err)
	}
	q := parsed.Query()
	q.Set("application_name", name)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

func newPool(t testing.TB, maxConns int32, name string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	if name != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = name
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// Schema returns a fresh schema name for t, with nothing in it yet (the schema
// itself may not exist), and drops that schema at cleanup.
func Schema(t testing.TB) string {
	t.Helper()
	p := Pool(t)
	dropStale.Do(func() { dropStaleObjects(context.Background(), p) })
	name := fmt.Sprintf("%s%d_%d_%d", schemaPrefix, time.Now().Unix(), os.Getpid(), schemaSeq.Add(1))
	t.Cleanup(func() {
		if _, err := p.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop test schema %s: %v", name, err)
		}
	})
	return name
}

// Database creates an empty database of its own for t, on the test
// database's server, drops it at cleanup (closing what is still connected),
// and returns its URL. Tests of a relay of several databases use it.
func Database(t testing.TB) string {
	t.Helper()
	name := Schema(t) // a fresh name; no such schema is made
	dbURL := WithDatabase(t, URL(t), name)
	ctx := context.Background()
	if _, err := Pool(t).Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create test database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if _, err := Pool(t).Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop test database %s: %v", name, err)
		}
	})
	return dbURL
}

// WithDatabase returns base, a server's URL, naming database name instead of
// its own.
func WithDatabase(t testing.TB, base, name string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		t.Fatalf("another database on the server needs its URL as a URL (postgres://…), not %q: %v", base, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Table creates a schema for t, migrates an outbox into it, and drops the schema
// at cleanup.
func Table(t testing.TB) outbox.Table {
	t.Helper()
	ctx := context.Background()
	tbl := outbox.Table{Schema: Schema(t), Name: "outbox"}
	conn, err := Pool(t).Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if _, err := outbox.Migrate(ctx, conn.Conn(), tbl); err != nil {
		t.Fatalf("migrate test schema %s: %v", tbl.Schema, err)
	}
	return tbl
}

var staleSchema = regexp.MustCompile(`^` + schemaPrefix + `(\d+)_`)

// dropStaleObjects drops test schemas, databases (Database) and roles
// (named after a schema) over an hour old: a killed test run leaves them
// behind. Databases go before roles, whose grants they may hold.
func dropStaleObjects(ctx context.Context, p *pgxpool.Pool) {
	for _, kind := range []struct{ list, drop string }{
		{"SELECT nspname FROM pg_catalog.pg_namespace WHERE nspname LIKE $1", "DROP SCHEMA IF EXISTS %s CASCADE"},
		{"SELECT datname FROM pg_catalog.pg_database WHERE datname LIKE $1", "DROP DATABASE IF EXISTS %s WITH (FORCE)"},
		{"SELECT rolname FROM pg_catalog.pg_roles WHERE rolname LIKE $1", "DROP ROLE IF EXISTS %s"},
	} {
		rows, err := p.Query(ctx, kind.list, schemaPrefix+"%")
		if err != nil {
			return
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return
		}
		for _, n := range names {
			m := staleSchema.FindStringSubmatch(n)
			if m == nil {
				continue
			}
			ts, _ := strconv.ParseInt(m[1], 10, 64)
			if time.Since(time.Unix(ts, 0)) > time.Hour {
				_, _ = p.Exec(ctx, fmt.Sprintf(kind.drop, pgx.Identifier{n}.Sanitize()))
			}
		}
	}
}

// Main runs a package's tests with [Run] and exits with its code.
func Main(m *testing.M) { os.Exit(Run(m)) }

// Run runs a package's tests, closes the shared pool and any container, and then
// fails the run if goroutines leaked. It returns the exit code.
func Run(m *testing.M) int {
	code := m.Run()
	for _, schema := range exampleSchemas {
		if _, err := pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			fmt.Fprintf(os.Stderr, "drop example schema %s: %v\n", schema, err)
			code = 1
		}
	}
	if pool != nil {
		pool.Close()
	}
	if container != nil {
		_ = container.Terminate(context.Background())
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goroutines leaked: %v\n", err)
			code = 1
		}
	}
	return code
}

// EveryRow is a FROM item, aliased every_row, for every row of tbl that is
// outstanding or was sent: those of the outbox and those the sweeper moved to
// its history table (migration 8). Tests that check what was written or what
// was charged read it, since a sent row leaves the outbox.
func EveryRow(tbl outbox.Table) string {
	const columns = "id, message_id, topic, payload, attempts, last_error, dispatched_at"
	return "(SELECT " + columns + " FROM " + pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize() +
		" UNION ALL SELECT " + columns + " FROM " + outbox.HistoryIdent(tbl) + ") AS every_row"
}

// Outstanding returns how many rows of tbl are not dispatched yet.
func Outstanding(t testing.TB, tbl outbox.Table) int {
	t.Helper()
	var n int
	err := Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+" WHERE dispatched_at IS NULL").Scan(&n)
	if err != nil {
		t.Fatalf("count outstanding rows of %s: %v", tbl, err)
	}
	return n
}

// FirstOutstanding returns the lowest id of an outstanding row of tbl at or
// above from, and false when there is none. A benchmark polls it while it
// times a drain, passing the id the previous call returned: in committed state
// the lowest outstanding id only grows, and starting there the scan steps over
// only the index entries of rows marked since the last call. Read from the
// table's start every time, each call stepped over the entries of every row
// the drain had marked so far (an index-only scan does not mark them dead):
// 36 ms a call, more than half a core of the two the drain it timed needed
// (counting the outstanding rows, before that, cost about as much).
func FirstOutstanding(t testing.TB, tbl outbox.Table, from int64) (int64, bool) {
	t.Helper()
	var id int64
	err := Pool(t).QueryRow(context.Background(), "SELECT id FROM "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+
		" WHERE dispatched_at IS NULL AND id >= $1 ORDER BY id LIMIT 1", from).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatalf("look for outstanding rows of %s: %v", tbl, err)
	}
	return id, true
}

// Eventually polls cond every 10ms until it holds, and fails t after timeout.
// Tests wait on the database this way rather than sleeping a guessed time.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// RunSweeper runs s in the background until the returned stop is called (or the
// test ends), which waits for Run to return and fails t if Run returned an
// error or took more than 2 minutes to stop (its grace period for batches in
// flight is 10s unless the test sets another; the rest is a busy machine's).
func RunSweeper(t testing.TB, s *outbox.Sweeper) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("sweeper Run: %v", err)
				}
			case <-time.After(2 * time.Minute):
				t.Error("sweeper Run did not return within 2 minutes of its context ending")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// LockTables takes ACCESS EXCLUSIVE locks on tables (quoted names) in a
// transaction of its own, as DDL, VACUUM FULL or an operator's LOCK TABLE
// would hold them, and returns the function that lets them go.
func LockTables(t testing.TB, tables ...string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+strings.Join(tables, ", ")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		_ = tx.Rollback(ctx)
		t.Fatal(err)
	}
	return func() { _ = tx.Rollback(ctx) }
}
