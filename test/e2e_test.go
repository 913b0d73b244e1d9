package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// describeSchema lists a schema's tables, columns and indexes, to compare two.
func describeSchema(t *testing.T, schema string) string {
	t.Helper()
	rows, err := dbtest.Pool(t).Query(context.Background(), `
		SELECT table_name || '.' || column_name || ' ' || data_type || ' ' || is_nullable || ' ' || coalesce(column_default, '')
		FROM information_schema.columns WHERE table_schema = $1
		UNION ALL
		SELECT indexname || ' ' || replace(indexdef, $1, 'S') FROM pg_indexes WHERE schemaname = $1
		ORDER BY 1`, schema)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return strings.Join(lines, "\n")
}

func TestMigrateTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)

	sequential := dbtest.Schema(t)
	code, out, stderr := runOnce(t, "migrate", "--database-url", url, "--schema", sequential)
	require.Equal(t, 0, code, stderr)
	latest := fmt.Sprint(outbox.SchemaVersion())
	require.Contains(t, out, "migrated from schema version 0 to "+latest)
	code, out, stderr = runOnce(t, "migrate", "--database-url", url, "--schema", sequential)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "is up to date at schema version "+latest)

	concurrent := dbtest.Schema(t)
	const n = 4
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		codes []int
		outs  []string
	)
	for range n {
		wg.Go(func() {
			code, out, stderr := runOnce(t, "migrate", "--database-url", url, "--schema", concurrent)
			mu.Lock()
			defer mu.Unlock()
			codes = append(codes, code)
			outs = append(outs, out+stderr)
		})
	}
	wg.Wait()
	require.Equal(t, []int{0, 0, 0, 0}, codes, "outputs: %q", outs)
	migratedCount := 0
	for _, o := range outs {
		if strings.Contains(o, "migrated from schema version 0 to "+latest) {
			migratedCount++
		} else {
			require.Contains(t, o, "is up to date at schema version "+latest)
		}
	}
	require.Equal(t, 1, migratedCount, "exactly one process applies the migration: %q", outs)

	a, b := describeSchema(t, sequential), describeSchema(t, concurrent)
	require.Contains(t, a, "outbox.message_id uuid NO gen_random_uuid()")
	require.Contains(t, a, "outbox_outstanding_idx")
	require.Contains(t, a, "outbox_outstanding_topic_idx")
	require.Contains(t, a, "outbox_dead_letter.reason text NO")
	require.Equal(t, strings.ReplaceAll(a, sequential, "S"), strings.ReplaceAll(b, concurrent, "S"))
}

// `sweeper migrate print` needs no database, and what it writes, run by psql,
// builds the schema `sweeper migrate` builds; `sweeper migrate status` says
// where a database is and what migrate would apply.
func TestMigratePrintRunByPsqlAndStatus(t *testing.T) {
	t.Parallel()
	psql, err := exec.LookPath("psql")
	require.NoError(t, err, "psql (Debian's postgresql-client) runs the printed schema; scripts/services.sh installs it")
	url := dbtest.URL(t)
	latest := fmt.Sprint(outbox.SchemaVersion())

	byScript := dbtest.Schema(t)
	code, out, stderr := runOnce(t, "migrate", "status", "--database-url", url, "--schema", byScript)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, byScript+".outbox is not migrated (version 0 of "+latest+")")
	require.Contains(t, out, "1  001_create_outbox.sql")

	code, script, stderr := runOnce(t, "migrate", "print", "--schema", byScript) // no database: it takes no --database-url
	require.Equal(t, 0, code, stderr)
	require.Contains(t, script, `CREATE TABLE "`+byScript+`"."outbox"`)
	cmd := exec.Command(psql, "-v", "ON_ERROR_STOP=1", "-q", "-d", url)
	cmd.Stdin = strings.NewReader(script)
	psqlOut, err := cmd.CombinedOutput()
	require.NoError(t, err, "psql: %s", psqlOut)

	code, out, stderr = runOnce(t, "migrate", "status", "--database-url", url, "--schema", byScript)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "is at schema version "+latest+", the newest")
	code, out, stderr = runOnce(t, "migrate", "--database-url", url, "--schema", byScript)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "is up to date at schema version "+latest)

	byMigrate := dbtest.Schema(t)
	code, _, stderr = runOnce(t, "migrate", "--database-url", url, "--schema", byMigrate)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, strings.ReplaceAll(describeSchema(t, byMigrate), byMigrate, "S"), strings.ReplaceAll(describeSchema(t, byScript), byScript, "S"))

	code, _, stderr = runOnce(t, "migrate", "print", "--from", "99")
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "--from is 99: the schema has versions 0 to "+latest)
	code, out, _ = runOnce(t, "migrate", "print", "--from", latest)
	require.Equal(t, 0, code)
	require.NotContains(t, out, "CREATE")
}

func TestMigrateReportsAnUnreachableDatabase(t *testing.T) {
	t.Parallel()
	p := tcpproxy.New(t, "127.0.0.1:1")
	p.Refuse(true)
	code, _, stderr := runOnce(t, "migrate", "--database-url", databaseURLVia(t, p.Addr()))
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "connect to postgres@127.0.0.1")
	require.Contains(t, stderr, "is Postgres running, and is --database-url right?")
}

func TestRunRelaysToStdoutAndExitsZeroOnSIGTERM(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	insertRows(t, tbl, "orders", 30)
	insertRows(t, tbl, "invoices", 20)

	p := start(t, []string{"OUTBOX_DATABASE_URL=" + dbtest.URL(t), "OUTBOX_SCHEMA=" + tbl.Schema, "OUTBOX_LOG_FORMAT=json"},
		"run", "--tick", "50ms", "--page-size", "16")
	dbtest.Eventually(t, 2*time.Minute, "50 lines on stdout", func() bool { return len(p.Lines()) >= 50 })
	// SIGHUP does not stop a relay of one (it ended the process at once,
	// its pages rolled back): it relays on, and exits 0 on the SIGTERM.
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	insertRows(t, tbl, "orders", 5)
	dbtest.Eventually(t, 2*time.Minute, "55 lines on stdout, after a SIGHUP", func() bool { return len(p.Lines()) >= 55 })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.Stderr())

	msgs := parseLines(t, p.Lines())
	require.Len(t, msgs, 55)
	last := map[string]int64{}
	for _, m := range msgs {
		require.Greater(t, m.ID, last[m.Topic], "order within %s", m.Topic)
		last[m.Topic] = m.ID
		require.Len(t, m.MessageID, 36)
		require.Equal(t, "{}", string(m.Headers))
		require.True(t, strings.HasPrefix(string(m.Payload), m.Topic+"-"), "payload %q", m.Payload)
		require.NotNil(t, m.CorrelationID)
	}
	require.Zero(t, dbtest.Outstanding(t, tbl))
	for _, l := range strings.Split(strings.TrimSpace(p.Stderr()), "\n") {
		require.True(t, strings.HasPrefix(l, "{"), "log line is not JSON: %q", l)
		require.NotContains(t, l, "orders-", "logs never carry a payload")
	}
	require.Contains(t, p.Stderr(), `"msg":"sweeper stopped"`)
}

// A cron schedule drives the ticks instead of --tick.
func TestRunOnACronSchedule(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	insertRows(t, tbl, "a", 5)
	p := start(t, nil, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--schedule", "@every 1s")
	dbtest.Eventually(t, 2*time.Minute, "5 lines", func() bool { return len(p.Lines()) >= 5 })
	insertRows(t, tbl, "b", 5) // picked up by a later tick
	dbtest.Eventually(t, 2*time.Minute, "10 lines", func() bool { return len(p.Lines()) >= 10 })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, p.wait(t, time.Minute))
	require.Len(t, parseLines(t, p.Lines()), 10)
}

// The binary with its topic breaker in Redis relays like the one in memory.
func TestRunWithTheTopicBreakerInRedis(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	insertRows(t, tbl, "a", 5)
	p := start(t, nil, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--tick", "50ms",
		"--redis-url", brokertest.RedisURL(t))
	dbtest.Eventually(t, 2*time.Minute, "5 lines", func() bool { return len(p.Lines()) >= 5 })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute))
	require.NotContains(t, p.Stderr(), "redis does not answer")
}

// The database is down when the sweeper starts, comes up, then drops every
// connection mid-run. The sweeper waits, reconnects, and delivers every row.
func TestDatabaseDownAtStartThenDroppedMidRun(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	insertRows(t, tbl, "a", 100)

	proxy := tcpproxy.New(t, dbHostPort(t))
	proxy.Refuse(true)

	p := start(t, nil, "run", "--database-url", databaseURLVia(t, proxy.Addr()), "--schema", tbl.Schema,
		"--tick", "50ms", "--page-size", "10")
	dbtest.Eventually(t, 2*time.Minute, "a logged retry", func() bool { return strings.Contains(p.Stderr(), "sweep failed; retrying") })
	require.Empty(t, p.Lines())

	proxy.Refuse(false)
	dbtest.Eventually(t, 2*time.Minute, "the first 100 rows", func() bool { return len(p.Lines()) >= 100 })
	// Logged when the sweep that relayed them returns, a moment after the lines.
	dbtest.Eventually(t, time.Minute, "the recovery logged", func() bool { return strings.Contains(p.Stderr(), "sweep succeeded again") })

	// Cut every connection while rows keep arriving: 100 rows at a time, each
	// time cut once the sweeper has begun relaying them, so that every cut
	// falls in the middle of the relay whatever the machine's pace.
	failedBefore := strings.Count(p.Stderr(), "sweep failed; retrying")
	for i := range 5 {
		relayed := len(p.Lines())
		insertRows(t, tbl, fmt.Sprint("b", 2*i), 50)
		insertRows(t, tbl, fmt.Sprint("b", 2*i+1), 50)
		dbtest.Eventually(t, 2*time.Minute, "the new rows being relayed", func() bool { return len(p.Lines()) > relayed })
		proxy.Cut()
	}
	dbtest.Eventually(t, 2*time.Minute, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	// The cuts were met: a statement on a cut connection failed its sweep,
	// which was tried again (a cut of idle connections alone would prove
	// nothing of a drop mid-run).
	require.Greater(t, strings.Count(p.Stderr(), "sweep failed; retrying"), failedBefore, "no sweep met a cut connection")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute))

	seen := map[int64]int{}
	for _, m := range parseLines(t, p.Lines()) {
		seen[m.ID]++
	}
	require.Len(t, seen, 600, "every row relayed at least once")
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("%d rows relayed more than once across the cuts (at-least-once)", dups)
}

// A sweeper killed with SIGKILL at random moments loses nothing: each restart
// takes over the rows the killed one held.
func TestKilledSweeperLosesNothing(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	const rows = 6000
	for i := range 6 {
		insertRows(t, tbl, fmt.Sprint("t", i), rows/6)
	}

	seen := map[int64]int{}
	args := []string{"run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--tick", "20ms", "--page-size", "50"}
	kills := 0
	for dbtest.Outstanding(t, tbl) > 0 {
		before := dbtest.Outstanding(t, tbl)
		p := start(t, nil, args...)
		// Let it relay a share of the rows and commit some of them (however
		// slow the machine, each process makes progress), then kill it
		// without warning, at a point that varies from kill to kill: 0 to
		// 39 lines past the share, so within a batch of 50 as often as
		// between two. A kill before any commit would undo all it sent: a
		// drain's page transactions (two lanes of up to 8 pages) hold up to
		// 800 rows here, more than a share, and a process killed each time
		// before its first commit never moves the outbox on.
		share := rows/20 + kills*7%40
		dbtest.Eventually(t, 2*time.Minute, "a share relayed and some committed, or an empty outbox", func() bool {
			out := dbtest.Outstanding(t, tbl)
			return out == 0 || (out < before && len(p.Lines()) >= share)
		})
		require.NoError(t, p.cmd.Process.Kill())
		p.wait(t, time.Minute)
		kills++
		lines := p.Lines()
		if n := len(lines); n > 0 && !strings.HasSuffix(lines[n-1], "}") {
			lines = lines[:n-1] // the kill cut the last write short: that line was never received
		}
		for _, m := range parseLines(t, lines) {
			seen[m.ID]++
		}
		require.Less(t, kills, 200, "the outbox never drained")
	}
	require.Len(t, seen, rows, "every row relayed at least once")
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("%d kills, %d rows relayed more than once", kills, dups)
	require.GreaterOrEqual(t, kills, 3, "the test must kill the sweeper mid-run")
}

func dbHostPort(t *testing.T) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}

// The dlq commands against rows the sweeper dead-lettered: list (table and
// JSON, payload only when asked), replay by id, purge with a dry run.
func TestDLQCommands(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	url := dbtest.URL(t)
	// Two dead letters, put there by hand (the sweeper's own dead-lettering is
	// tested in package outbox).
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		`INSERT INTO %s (topic, payload, correlation_id) VALUES ('orders', 'SECRET-PAYLOAD-1', 'corr-1'), ('orders', 'SECRET-PAYLOAD-2', 'corr-2')`,
		pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()))
	require.NoError(t, err)
	_, err = dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		`WITH moved AS (DELETE FROM %s RETURNING *)
		 INSERT INTO %s (id, message_id, topic, payload, headers, correlation_id, created_at, attempts, reason, error)
		 SELECT id, message_id, topic, payload, headers, correlation_id, created_at, 10, 'max_retries_exceeded', 'broker said no' FROM moved`,
		pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize(), pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()))
	require.NoError(t, err)
	db := []string{"--database-url", url, "--schema", tbl.Schema}

	// An outbox not there (not migrated, or another named): the error says
	// to migrate it or to name the outbox.
	code, _, stderr := runOnce(t, "dlq", "list", "--database-url", url, "--schema", "no_such_outbox")
	require.Equal(t, 1, code, stderr)
	require.Contains(t, stderr, "is the outbox no_such_outbox.outbox migrated? run `sweeper migrate --schema no_such_outbox --table outbox`")

	code, out, stderr := runOnce(t, append([]string{"dlq", "list"}, db...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "max_retries_exceeded")
	require.Contains(t, out, "corr-1")
	require.NotContains(t, out, "SECRET", "no payload unless asked")

	code, out, _ = runOnce(t, append([]string{"dlq", "list", "--json", "--show-payload"}, db...)...)
	require.Equal(t, 0, code)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 2)
	require.Contains(t, out, `"payload":"U0VDUkVULVBBWUxPQUQt`) // base64 of SECRET-PAYLOAD-

	// The example of docs/concepts.md ("Dead letters"): one dead letter by id,
	// with its payload.
	code, out, stderr = runOnce(t, append([]string{"dlq", "list", "--id", "2", "--show-payload", "--json"}, db...)...)
	require.Equal(t, 0, code, stderr)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 1)
	require.Contains(t, out, `"corr-2"`)

	code, _, stderr = runOnce(t, append([]string{"dlq", "replay"}, db...)...)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, "give ids or a filter, or select all explicitly")
	code, out, stderr = runOnce(t, append([]string{"dlq", "replay", "--all", "--dry-run"}, db...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "would replay 2 dead letters")
	require.NotContains(t, stderr, "admin action", "a dry run changes nothing")
	require.Zero(t, dbtest.Outstanding(t, tbl), "a dry run replays nothing")
	code, out, stderr = runOnce(t, append([]string{"dlq", "replay", "--id", "1"}, db...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "replayed 1 dead letters")
	// The change is audited like the admin API's, on stderr.
	require.Contains(t, stderr, `msg="admin action" action="dead letters replay" count=1`)
	require.Contains(t, stderr, "ids=[1]")
	require.Equal(t, 1, dbtest.Outstanding(t, tbl))

	code, out, _ = runOnce(t, append([]string{"dlq", "purge", "--all", "--dry-run"}, db...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "would purge 1 dead letters")
	code, out, stderr = runOnce(t, append([]string{"dlq", "purge", "--older-than", "1h"}, db...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "purged 0 dead letters", "the dead letter is younger than an hour")
	require.Contains(t, stderr, `msg="admin action" action="dead letters purge" count=0`)
	code, _, stderr = runOnce(t, append([]string{"dlq", "purge", "--id", "x"}, db...)...)
	require.Equal(t, 2, code)
	require.Contains(t, stderr, `invalid value "x" for --id`)
}

// The binary's dead-letter probe posts to the webhook: a dead letter put there
// by hand gets one alert, with its correlation id and no payload, however many
// probes run.
func TestBinaryProbeAlertsTheWebhook(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	tbl := migrated(t)
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		`INSERT INTO %s (id, message_id, topic, payload, correlation_id, created_at, reason, error)
		 VALUES (1, gen_random_uuid(), 'orders', 'SECRET', 'corr-x', now(), 'invalid_message', 'bad')`,
		pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()))
	require.NoError(t, err)
	p := start(t, nil, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema,
		"--alert-webhook-url", srv.URL, "--dlq-probe-schedule", "@every 1s")
	dbtest.Eventually(t, 2*time.Minute, "an alert", func() bool { mu.Lock(); defer mu.Unlock(); return len(bodies) > 0 })
	// Two more probes, which must not alert again: the third's start shows
	// the second has ended (an instance runs its probes one after another).
	for range 3 {
		awaitProbe(t, tbl)
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, bodies, 1, "one alert per growth")
	require.Contains(t, bodies[0], `"correlation_ids":["corr-x"]`)
	require.NotContains(t, bodies[0], "SECRET")
	require.Contains(t, p.Stderr(), "dead letters in")
}

// awaitProbe waits for the next dead-letter probe of tbl to start, and lets it
// run. Each probe reads the watermark row FOR UPDATE, in the transaction in
// which it looks for dead letters and alerts: the test holds that row until a
// session waits for it, and lets go.
func awaitProbe(t *testing.T, tbl outbox.Table) {
	t.Helper()
	ctx := context.Background()
	tx, err := dbtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT FROM "+pgx.Identifier{tbl.Schema, tbl.Name + "_probe"}.Sanitize()+" FOR UPDATE")
	require.NoError(t, err)
	var pid int32
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	dbtest.Eventually(t, 2*time.Minute, "a dead-letter probe", func() bool {
		var waiting bool
		require.NoError(t, dbtest.Pool(t).QueryRow(ctx,
			"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid)))", pid).Scan(&waiting))
		return waiting
	})
}

// startWithAdmin runs the binary on tbl with its admin API on a free port
// behind the token t0ken, and more args, and waits until it is ready. It
// returns the process and the API's base URL.
func startWithAdmin(t *testing.T, tbl outbox.Table, args ...string) (*proc, string) {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	p := start(t, []string{"OUTBOX_ADMIN_ADDR=" + addr, "OUTBOX_ADMIN_TOKEN=t0ken"},
		append([]string{"run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema}, args...)...)
	dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { return readyz(addr) == http.StatusOK })
	return p, "http://" + addr
}

// The binary serves the admin API: readiness, and a topic tripped and reset
// over HTTP with the token.
func TestBinaryAdminAPI(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	p, base := startWithAdmin(t, tbl)
	call := func(method, path, token string) (int, string) {
		req, err := http.NewRequest(method, base+path, nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json") // the API takes changes in JSON only
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, _ := call("GET", "/topics/tripped", "")
	require.Equal(t, 401, code)
	code, body := call("POST", "/topics/orders/trip", "t0ken")
	require.Equal(t, 200, code, body)
	code, body = call("GET", "/topics/tripped", "t0ken")
	require.Equal(t, 200, code)
	require.Contains(t, body, `"topic":"orders"`)
	code, body = call("GET", "/breaker", "t0ken")
	require.Equal(t, 200, code)
	require.Contains(t, body, `"state":"closed"`)
	code, body = call("GET", "/metrics", "") // no token needed
	require.Equal(t, 200, code)
	require.Contains(t, body, "outbox_dependency_circuit_breaker_state 0")
	require.Contains(t, body, `outbox_topic_tripped{topic="orders"} 1`)

	// The topics CLI against the same running API.
	cli := []string{"--admin-url", base}
	code, out, stderr := runOnce(t, append([]string{"topics", "list"}, cli...)...)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "give --admin-token")
	cli = append(cli, "--admin-token", "t0ken")
	code, out, stderr = runOnce(t, append([]string{"topics", "trip", "pay'ments;", "--reason", "by hand"}, cli...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, `topic "pay'ments;" is tripped`)
	code, out, _ = runOnce(t, append([]string{"topics", "list"}, cli...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "pay'ments;")
	require.Contains(t, out, "by hand")
	code, out, _ = runOnce(t, append([]string{"topics", "list", "--json"}, cli...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, `"tripped":[`)
	code, out, _ = runOnce(t, append([]string{"topics", "reset", "pay'ments;"}, cli...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "is closed")

	// The broker breaker tripped by hand: rows written meanwhile wait, not
	// charged, until it is reset.
	code, out, stderr = runOnce(t, append([]string{"breaker", "trip", "--reason", "broker failover"}, cli...)...)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, out, "broker breaker is open (tripped by hand: broker failover")
	insertRows(t, tbl, "held", 5)
	// And a row past its deadline: a tick expires it even with the breaker
	// open, so its dead letter says a tick ran after the rows were written
	// (the breaker's gauge is set by the trip itself, before any sweep met
	// it, and a blocked sweep is not counted).
	_, err := dbtest.Pool(t).Exec(context.Background(), "INSERT INTO "+tbl.Ident()+" (topic, payload, expires_at) VALUES ('held', 'late', now() - interval '1 minute')")
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "a tick after the rows were written", func() bool {
		var n int
		require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT count(*) FROM "+tbl.DeadLetterIdent()+" WHERE reason = 'expired'").Scan(&n))
		return n == 1
	})
	// It served as a witness; requireNothingCharged counts dead letters too.
	_, err = dbtest.Pool(t).Exec(context.Background(), "DELETE FROM "+tbl.DeadLetterIdent())
	require.NoError(t, err)
	_, metricsBody := call("GET", "/metrics", "")
	require.Contains(t, metricsBody, "outbox_dependency_circuit_breaker_state 1")
	require.Equal(t, 5, dbtest.Outstanding(t, tbl))
	requireNothingCharged(t, tbl)
	code, out, _ = runOnce(t, append([]string{"breaker", "status"}, cli...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "tripped by hand: broker failover")
	code, out, _ = runOnce(t, append([]string{"breaker", "reset"}, cli...)...)
	require.Equal(t, 0, code)
	require.Contains(t, out, "broker breaker is closed")
	dbtest.Eventually(t, time.Minute, "the held rows sent after the reset", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	require.Contains(t, p.Stderr(), `admin action`)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute))
}
