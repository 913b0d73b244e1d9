package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// readyz returns the status code of the admin API's /readyz, or 0 when it does
// not answer.
func readyz(addr string) int {
	client := http.Client{Timeout: 30 * time.Second} // only bounds a server that never answers
	resp, err := client.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Postgres, a server of the test's own, is restarted (or crashes) while the
// application writes and the binary relays: the sweeper reports the outage on
// /readyz while it lasts, reconnects, and every row that made it into the
// outbox is relayed. A crash loses the sweeper's latest marks (they commit
// without waiting for the disk): their rows are sent again, never lost.
func TestPostgresRestartedMidRunLosesNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"restarted", "crashed"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			postgresStoppedMidRun(t, mode == "crashed")
		})
	}
}

func postgresStoppedMidRun(t *testing.T, crash bool) {
	srv := dbtest.StartServer(t)
	code, _, stderr := runOnce(t, "migrate", "--database-url", srv.URL())
	require.Equal(t, 0, code, stderr)
	tbl := outbox.Table{}.WithDefaults()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL())
	require.NoError(t, err)
	defer pool.Close()

	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	p := start(t, nil, "run", "--database-url", srv.URL(), "--tick", "100ms", "--page-size", "50", "--admin-addr", addr)
	dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { return readyz(addr) == http.StatusOK })

	// The application writes 20 rows every 10ms; writes fail while the server
	// is down, and a commit cut off by the stop may or may not have landed,
	// so the rows to find at the end are the ones in the table then.
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	stopWriter := pacedWriter(t, func(ctx context.Context, i int) error {
		msgs := make([]outbox.Message, 20)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: fmt.Sprint("t", j%4), Payload: fmt.Appendf(nil, "%d-%d", i, j)}
		}
		return w.Write(ctx, pool, msgs...)
	})
	restartUnder(t, srv, p, addr, crash, func() {
		// The outage lasts: once the sweeper has failed a sweep more on
		// it, /readyz still reports it.
		require.Equal(t, http.StatusServiceUnavailable, readyz(addr), "the outage lasts")
		requireUnreachable(t, addr, "/status")
		requireUnreachable(t, addr, "/dlq")
	})
	failedWrites := stopWriter()

	outstanding := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE dispatched_at IS NULL").Scan(&n))
		return n
	}
	dbtest.Eventually(t, 2*time.Minute, "every row dispatched", func() bool { return outstanding() == 0 })
	// The listener reconnects on its own backoff, which may come after the drain.
	dbtest.Eventually(t, time.Minute, "the listen connection back", func() bool {
		return strings.Contains(p.Stderr(), "listening for commits again")
	})
	// The first sweep after the outage may still be draining when every row
	// is out: its success is logged when it returns, at its tick's end.
	dbtest.Eventually(t, time.Minute, "a sweep succeeding after the outage", func() bool {
		return strings.Contains(p.Stderr(), "sweep succeeded again")
	})
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute))

	rows, err := pool.Query(ctx, "SELECT id FROM outbox UNION ALL SELECT id FROM outbox_history")
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	seen := map[int64]int{}
	for _, m := range parseLines(t, p.Lines()) {
		seen[m.ID]++
	}
	for _, id := range ids {
		require.Positive(t, seen[id], "row %d was committed but never relayed", id)
	}
	dups := 0
	for _, n := range seen {
		dups += n - 1
	}
	t.Logf("%d rows committed, %d writes failed during the outage, %d rows relayed more than once", len(ids), failedWrites, dups)
	require.Positive(t, failedWrites, "the application must have seen the outage")
	stderr = p.Stderr()
	require.Contains(t, stderr, "sweep failed; retrying")
}

// Postgres, a server of the test's own, restarts (or crashes) under a relay of
// many outboxes (--schemas) while the application writes into every tenant:
// /readyz reports the outage, a scrape of /metrics still answers (the tenants'
// backlog series left out while the database does not), the fleet listens
// again, and every row committed into any tenant is relayed, under that
// tenant's name.
func TestPostgresRestartedUnderManyOutboxesLosesNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"restarted", "crashed"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			postgresStoppedUnderTenants(t, mode == "crashed")
		})
	}
}

func postgresStoppedUnderTenants(t *testing.T, crash bool) {
	const tenants = 5
	srv := dbtest.StartServer(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, srv.URL())
	require.NoError(t, err)
	defer pool.Close()
	var tbls []outbox.Table
	for i := range tenants {
		tbl := outbox.Table{Schema: fmt.Sprintf("tenant_%d", i), Name: "outbox"}
		_, err := pool.Exec(ctx, "CREATE SCHEMA "+tbl.Schema)
		require.NoError(t, err)
		tbls = append(tbls, tbl)
	}
	code, out, stderr := runOnce(t, "migrate", "--database-url", srv.URL(), "--schemas", "tenant_*")
	require.Equal(t, 0, code, "migrate --schemas: %s%s", out, stderr)

	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	p := start(t, nil, "run", "--database-url", srv.URL(), "--schemas", "tenant_*", "--destination", "{schema}.{topic}",
		"--tick", "100ms", "--page-size", "50", "--admin-addr", addr, "--metrics-outboxes", "tenant_0")
	dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { return readyz(addr) == http.StatusOK })

	// The application writes 4 rows every 10ms, into each tenant in turn;
	// writes fail while the server is down, and a commit cut off by the stop
	// may or may not have landed: the rows to find are those in the tables
	// at the end.
	writers := make([]*outbox.Writer, tenants)
	for i, tbl := range tbls {
		writers[i], err = outbox.NewWriter(tbl)
		require.NoError(t, err)
	}
	stopWriter := pacedWriter(t, func(ctx context.Context, i int) error {
		msgs := make([]outbox.Message, 4)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: fmt.Sprint("t", j%2), Payload: fmt.Appendf(nil, "%d-%d", i, j)}
		}
		return writers[i%tenants].Write(ctx, pool, msgs...)
	})
	restartUnder(t, srv, p, addr, crash, func() {
		// The scrape answers without the series it cannot read; the named
		// tenant's others are there.
		body := scrape(t, addr)
		require.Contains(t, body, `outbox_tenant_parked{outbox="tenant_0"}`)
		require.NotContains(t, body, `outbox_tenant_backlog_messages{outbox="tenant_0"}`)
		// The tenants' list, and a tenant's status, cannot be read: each
		// says so, at once, and names the database.
		requireUnreachable(t, addr, "/outboxes")
		requireUnreachable(t, addr, "/outboxes/tenant_0/status")
	})
	dbtest.Eventually(t, time.Minute, "the backlog series back", func() bool {
		return strings.Contains(scrape(t, addr), `outbox_tenant_backlog_messages{outbox="tenant_0"}`)
	})
	failedWrites := stopWriter()

	outstanding := func() int {
		n := 0
		for _, tbl := range tbls {
			var c int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl.Ident()+" WHERE dispatched_at IS NULL").Scan(&c))
			n += c
		}
		return n
	}
	dbtest.Eventually(t, 2*time.Minute, "every row dispatched", func() bool { return outstanding() == 0 })
	dbtest.Eventually(t, time.Minute, "the listen session back", func() bool {
		return strings.Contains(p.Stderr(), "listening for commits again")
	})
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute))

	// Each tenant's ids are its own sequence: a row is known by its tenant,
	// which the destination names, and its id.
	seen := map[string]int{}
	for _, m := range parseLines(t, p.Lines()) {
		schema, _, ok := strings.Cut(m.Topic, ".")
		require.True(t, ok, "topic %q names no tenant", m.Topic)
		seen[fmt.Sprintf("%s/%d", schema, m.ID)]++
	}
	committed := 0
	for _, tbl := range tbls {
		rows, err := pool.Query(ctx, "SELECT id FROM "+tbl.Ident()+" UNION ALL SELECT id FROM "+
			outbox.HistoryIdent(tbl))
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.NotEmpty(t, ids, "%s got no row", tbl.Schema)
		for _, id := range ids {
			require.Positive(t, seen[fmt.Sprintf("%s/%d", tbl.Schema, id)], "%s's row %d was committed but never relayed under its name", tbl.Schema, id)
		}
		committed += len(ids)
	}
	require.Len(t, seen, committed, "a row relayed that no tenant holds, or under another's name")
	t.Logf("%d rows committed into %d tenants, %d writes failed during the outage, %d lines relayed", committed, tenants, failedWrites, len(p.Lines()))
	require.Positive(t, failedWrites, "the application must have seen the outage")
}

// pacedWriter calls write every 10 ms (its i counting the calls), each with
// 2 s to commit, until the returned stop, which waits for it and returns how
// many calls failed: the application, writing throughout an outage.
func pacedWriter(t *testing.T, write func(ctx context.Context, i int) error) (stop func() int) {
	t.Helper()
	done := make(chan struct{})
	var (
		wg     sync.WaitGroup
		once   sync.Once
		failed int
	)
	stop = func() int { once.Do(func() { close(done) }); wg.Wait(); return failed }
	t.Cleanup(func() { stop() }) // a test that fails midway must not leave the writer running
	wg.Go(func() {
		for i := 0; ; i++ {
			select { // paces the writes: the application writes throughout
			case <-done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := write(ctx, i); err != nil {
				failed++
			}
			cancel()
		}
	})
	return stop
}

// requireUnreachable calls the admin API at addr on path while the test's
// database (named postgres) is down, and requires the answer an operator
// can act on: 503 at once, naming the database, with a Retry-After.
func requireUnreachable(t *testing.T, addr, path string) {
	t.Helper()
	client := http.Client{Timeout: 30 * time.Second} // only bounds a server that never answers
	resp, err := client.Get("http://" + addr + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "GET %s: %s", path, raw)
	require.Contains(t, string(raw), `database \"postgres\" is unreachable`, "GET %s", path)
	require.Equal(t, "5", resp.Header.Get("Retry-After"), "GET %s", path)
}

// restartUnder stops srv (or crashes it) once the binary p, whose admin API
// is at addr, has relayed 200 rows; waits until /readyz reports the outage
// and a sweep more has failed on it; calls during; starts srv again, and
// waits until /readyz is ready and p has relayed 200 rows more.
func restartUnder(t *testing.T, srv *dbtest.Server, p *proc, addr string, crash bool, during func()) {
	t.Helper()
	dbtest.Eventually(t, 2*time.Minute, "rows relayed before the restart", func() bool { return len(p.Lines()) >= 200 })
	if crash {
		srv.Crash()
	} else {
		srv.Stop()
	}
	dbtest.Eventually(t, time.Minute, "/readyz reporting the outage", func() bool { return readyz(addr) == http.StatusServiceUnavailable })
	failedSweeps := strings.Count(p.Stderr(), "sweep failed; retrying")
	dbtest.Eventually(t, 2*time.Minute, "a later sweep failing on the outage", func() bool {
		return strings.Count(p.Stderr(), "sweep failed; retrying") > failedSweeps
	})
	during()
	srv.Start()
	dbtest.Eventually(t, 2*time.Minute, "/readyz ready again", func() bool { return readyz(addr) == http.StatusOK })
	relayedBefore := len(p.Lines())
	dbtest.Eventually(t, 2*time.Minute, "rows relayed after the restart", func() bool { return len(p.Lines()) >= relayedBefore+200 })
}

// A sweeper that freezes in the middle of a send (here: its stdout is a pipe
// nobody reads, so a batch's write blocks for good, and then it is stopped with
// SIGSTOP) holds its page's rows in an open transaction. Its keep-alive stops
// once the send has outlasted --send-timeout, Postgres ends that session once
// it has been idle for --send-timeout plus 5s, and another
// instance relays the rows: the bound on how long a dead or frozen instance can
// hold rows.
func TestFrozenInstanceRowsArePickedUpWithinTheBound(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	insertRows(t, tbl, "frozen", 3000)
	const sendTimeout = time.Second
	app := "frozen-" + tbl.Schema
	frozen := exec.Command(sweeperBin, "run", "--database-url", dbtest.NamedURL(t, dbtest.URL(t), app), "--schema", tbl.Schema,
		"--send-timeout", sendTimeout.String(), "--notify=false")
	frozen.Env = []string{"PATH=" + os.Getenv("PATH"), "OUTBOX_ADMIN_ADDR="}
	_, err := frozen.StdoutPipe() // never read: a batch's writes block once the pipe is full
	require.NoError(t, err)
	require.NoError(t, frozen.Start())
	t.Cleanup(func() { _ = frozen.Process.Kill(); _ = frozen.Wait() })

	// The frozen instance's batch: its session idle in a transaction that has
	// claimed rows of the outbox (the claim's SELECT … FOR UPDATE takes ROW
	// SHARE on the table, in the statement that sets the transaction's idle
	// timeout; a plain read takes ACCESS SHARE only), since when, and
	// Postgres's clock now.
	outboxIdent := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	const claimed = `EXISTS (SELECT FROM pg_locks l WHERE l.pid = a.pid AND l.relation = $2::regclass AND l.mode = 'RowShareLock')`
	type session struct {
		pid   int32
		state string // "" once the session is gone
		since time.Time
		now   time.Time
	}
	look := func(pid int32) session {
		x := session{pid: pid}
		var state *string
		var since *time.Time
		require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), `
			SELECT clock_timestamp(), a.state, a.state_change
			FROM (SELECT 1) one LEFT JOIN pg_stat_activity a ON a.pid = $1`, pid).Scan(&x.now, &state, &since))
		if state != nil {
			x.state, x.since = *state, *since
		}
		return x
	}

	// Follow its batches' sessions until Postgres ends one: until the pipe is
	// full batches go quickly and their sessions move on; the batch whose
	// write fills the pipe never ends, and its session stays idle until
	// Postgres ends it. No signal is sent meanwhile: a process stopped in the
	// middle of talking to Postgres could leave its session in a state no
	// idle timeout covers.
	var (
		held            int
		idleFrom, ended time.Time
	)
	dbtest.Eventually(t, 3*time.Minute, "a batch of the frozen instance held until Postgres ends its session", func() bool {
		var c session
		err := dbtest.Pool(t).QueryRow(context.Background(), `SELECT a.pid, a.state_change FROM pg_stat_activity a
			WHERE a.application_name = $1 AND a.state = 'idle in transaction' AND `+claimed, app, outboxIdent).Scan(&c.pid, &c.since)
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		held, idleFrom = dbtest.Outstanding(t, tbl), c.since
		// The poll's pace (10ms) cannot decide the outcome: the end is read on
		// Postgres's clock (x.now), and a poll that comes late only adds to
		// heldFor, which the bound below allows 5 s of slack for.
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			x := look(c.pid)
			switch {
			case x.state == "" && x.now.Sub(idleFrom) >= outbox.IdleInTransactionTimeout(sendTimeout):
				ended = x.now // ended once its idle timeout was up: by it
				return true
			case strings.HasPrefix(x.state, "idle in transaction") && x.since.Equal(idleFrom):
				// Still idle in the same batch: no statement has run since
				// (state_change is unchanged). Its lock is not required here:
				// a session whose idle timeout fired releases its locks while
				// it ends, before it leaves pg_stat_activity, and a poll in
				// between (a wide window on a loaded machine) sees it idle
				// with no lock.
			default:
				return false // moved on: that batch was not the frozen one
			}
		}
		t.Fatalf("Postgres never ended session %d, idle in a batch since %s", c.pid, idleFrom)
		return false
	})
	// Frozen in its send for good, it is stopped too: nothing of it stirs
	// while the other instance relays.
	require.NoError(t, frozen.Process.Signal(syscall.SIGSTOP))
	require.Positive(t, held)
	heldFor := ended.Sub(idleFrom)
	bound := outbox.IdleInTransactionTimeout(sendTimeout) // send timeout + 5s
	t.Logf("Postgres ended the frozen batch's session %s after it went idle (bound %s); %d rows outstanding then",
		heldFor.Round(10*time.Millisecond), bound, held)
	// Both times are Postgres's. The slack covers only this test's polling
	// (every 10ms, each query slow on a loaded machine), not the instance.
	require.Less(t, heldFor, bound+5*time.Second, "the frozen batch held its rows past the bound")

	// Another instance relays them.
	p := start(t, nil, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--tick", "100ms")
	dbtest.Eventually(t, 2*time.Minute, "every row dispatched by the other instance", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	dbtest.Eventually(t, time.Minute, "every outstanding row relayed", func() bool { return len(p.Lines()) >= held })
}
