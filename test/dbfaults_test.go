package test

import (
	"context"
	"fmt"
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
	client := http.Client{Timeout: 3 * time.Second}
	resp, err := client.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Postgres, a server of the test's own, is restarted while the application
// writes and the binary relays: the sweeper reports the outage on /readyz while
// it lasts, reconnects, and every row that made it into the outbox is relayed.
func TestPostgresRestartedMidRunLosesNothing(t *testing.T) {
	t.Parallel()
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
	dbtest.Eventually(t, 20*time.Second, "ready", func() bool { return readyz(addr) == http.StatusOK })

	// The application writes 20 rows every 10ms; writes fail while the server
	// is down, and a commit cut off by the stop may or may not have landed,
	// so the rows to find at the end are the ones in the table then.
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	stopWriting := make(chan struct{})
	var (
		wg           sync.WaitGroup
		stopOnce     sync.Once
		failedWrites int
	)
	stopWriter := func() { stopOnce.Do(func() { close(stopWriting) }); wg.Wait() }
	t.Cleanup(stopWriter) // a test that fails midway must not leave the writer running
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopWriting:
				return
			case <-time.After(10 * time.Millisecond):
			}
			msgs := make([]outbox.Message, 20)
			for j := range msgs {
				msgs[j] = outbox.Message{Topic: fmt.Sprint("t", j%4), Payload: fmt.Appendf(nil, "%d-%d", i, j)}
			}
			writeCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
			if err := w.Write(writeCtx, pool, msgs...); err != nil {
				failedWrites++
			}
			cancel()
		}
	})

	dbtest.Eventually(t, 20*time.Second, "rows relayed before the restart", func() bool { return len(p.Lines()) >= 200 })
	srv.Stop()
	dbtest.Eventually(t, 10*time.Second, "/readyz reporting the outage", func() bool { return readyz(addr) == http.StatusServiceUnavailable })
	time.Sleep(time.Second)
	require.Equal(t, http.StatusServiceUnavailable, readyz(addr), "the outage lasts")
	srv.Start()
	dbtest.Eventually(t, 30*time.Second, "/readyz ready again", func() bool { return readyz(addr) == http.StatusOK })
	relayedBefore := len(p.Lines())
	dbtest.Eventually(t, 30*time.Second, "rows relayed after the restart", func() bool { return len(p.Lines()) >= relayedBefore+200 })
	stopWriter()

	outstanding := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM outbox WHERE dispatched_at IS NULL").Scan(&n))
		return n
	}
	dbtest.Eventually(t, 60*time.Second, "every row dispatched", func() bool { return outstanding() == 0 })
	// The listener reconnects on its own backoff, which may come after the drain.
	dbtest.Eventually(t, 30*time.Second, "the listen connection back", func() bool {
		return strings.Contains(p.Stderr(), "listening for commits again")
	})
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, 30*time.Second))

	rows, err := pool.Query(ctx, "SELECT id FROM outbox")
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
	require.Contains(t, stderr, "sweep succeeded again")
}

// A sweeper that freezes in the middle of a send (here: its stdout is a pipe
// nobody reads, and then it is stopped with SIGSTOP) holds its batch's rows in
// an open transaction. Postgres ends that session once it has been idle for
// --send-timeout plus 5s, and another instance relays the rows: the bound on how
// long a dead or frozen instance can hold rows.
func TestFrozenInstanceRowsArePickedUpWithinTheBound(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	insertRows(t, tbl, "frozen", 3000)
	const sendTimeout = time.Second
	url := dbtest.URL(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	app := "frozen-" + tbl.Schema

	frozen := exec.Command(sweeperBin, "run", "--database-url", url+sep+"application_name="+app, "--schema", tbl.Schema,
		"--send-timeout", sendTimeout.String(), "--notify=false")
	frozen.Env = []string{"PATH=" + os.Getenv("PATH"), "OUTBOX_ADMIN_ADDR="}
	_, err := frozen.StdoutPipe() // never read: a batch's writes block once the pipe is full
	require.NoError(t, err)
	require.NoError(t, frozen.Start())
	t.Cleanup(func() { _ = frozen.Process.Kill(); _ = frozen.Wait() })

	dbtest.Eventually(t, 20*time.Second, "the frozen instance holding a batch", func() bool {
		var n int
		require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction'", app).Scan(&n))
		return n > 0
	})
	require.NoError(t, frozen.Process.Signal(syscall.SIGSTOP))
	held := dbtest.Outstanding(t, tbl)
	require.Positive(t, held)

	begin := time.Now()
	p := start(t, nil, "run", "--database-url", url, "--schema", tbl.Schema, "--tick", "100ms")
	dbtest.Eventually(t, 30*time.Second, "every row dispatched by the other instance", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	took := time.Since(begin)
	t.Logf("the other instance relayed the %d outstanding rows %s after the freeze", held, took.Round(10*time.Millisecond))
	// The frozen batch's rows were held for at most send timeout + 5s; the
	// rest is the other instance's start and a tick, with room for a loaded
	// machine.
	require.Less(t, took, sendTimeout+5*time.Second+5*time.Second)
	dbtest.Eventually(t, 10*time.Second, "every outstanding row relayed", func() bool { return len(p.Lines()) >= held })
}
