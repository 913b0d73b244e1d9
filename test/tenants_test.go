package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// tenantSchemas creates n empty schemas base_t000 to base_t<n-1>, dropped at
// cleanup, and returns their outbox tables (not migrated).
func tenantSchemas(t *testing.T, base string, n int) []outbox.Table {
	t.Helper()
	var tbls []outbox.Table
	for i := range n {
		s := fmt.Sprintf("%s_t%03d", base, i)
		_, err := dbtest.Pool(t).Exec(context.Background(), "CREATE SCHEMA "+pgx.Identifier{s}.Sanitize())
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		})
		tbls = append(tbls, outbox.Table{Schema: s, Name: "outbox"})
	}
	return tbls
}

// migratedTenants creates n tenant schemas (tenantSchemas) and migrates them
// with the binary's `migrate --schemas`, and returns the pattern that names
// them and their outbox tables.
func migratedTenants(t *testing.T, n int) (string, []outbox.Table) {
	t.Helper()
	base := dbtest.Schema(t)
	tbls := tenantSchemas(t, base, n)
	pattern := base + "_t*"
	code, out, errOut := runOnce(t, "migrate", "--database-url", dbtest.URL(t), "--schemas", pattern)
	require.Equal(t, 0, code, "migrate --schemas: %s%s", out, errOut)
	require.Contains(t, out, fmt.Sprintf("%d schemas matching %q migrated", n, pattern))
	return pattern, tbls
}

// migrate --schemas goes on past a schema it cannot migrate and one whose
// name it leaves out, migrates the others, says which failed and why, and
// exits non-zero; run again once the fault is mended, it finishes the job.
func TestMigrateSchemasGoesOnPastAFailedSchema(t *testing.T) {
	base := dbtest.Schema(t)
	ctx := context.Background()
	pool := dbtest.Pool(t)
	good, clash, odd := base+"_ta", base+"_tc", base+"_tB"
	for _, s := range []string{good, clash, odd} {
		_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s}.Sanitize())
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		})
	}
	// A table of the application's under the outbox's name fails the
	// first migration in that schema.
	_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{clash, "outbox"}.Sanitize()+" (id int)")
	require.NoError(t, err)

	pattern := base + "_t*"
	code, out, errOut := runOnce(t, "migrate", "--database-url", dbtest.URL(t), "--schemas", pattern)
	require.NotEqual(t, 0, code, "migrate with a schema failed: %s%s", out, errOut)
	require.Contains(t, out, odd+": left out: schema (--schemas)")
	require.Contains(t, out, clash+".outbox: failed:")
	require.Contains(t, errOut, fmt.Sprintf("2 of 3 schemas matching %q failed to migrate", pattern))
	version := func(tbl outbox.Table) int32 {
		v, err := outbox.CurrentSchemaVersion(ctx, pool, tbl)
		require.NoError(t, err)
		return v
	}
	require.Equal(t, outbox.SchemaVersion(), version(outbox.Table{Schema: good, Name: "outbox"}), "the good schema migrated")
	require.Zero(t, version(outbox.Table{Schema: clash, Name: "outbox"}), "the failed schema's migration left nothing recorded")

	_, err = pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{clash, "outbox"}.Sanitize())
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{odd}.Sanitize())
	require.NoError(t, err)
	code, out, errOut = runOnce(t, "migrate", "--database-url", dbtest.URL(t), "--schemas", pattern)
	require.Equal(t, 0, code, "migrate again: %s%s", out, errOut)
	require.Contains(t, out, fmt.Sprintf("2 schemas matching %q migrated or up to date", pattern))
	require.Equal(t, outbox.SchemaVersion(), version(outbox.Table{Schema: clash, Name: "outbox"}))
}

// Two processes of the binary relay 200 tenant schemas (migrated by `migrate
// --schemas`) into RabbitMQ under {schema}.{topic}, while the application
// writes into 20 of them and one process is killed with SIGKILL three times:
// every row arrives under its own tenant's name, none is lost, and the two
// processes together never hold more than their budgets of connections.
func TestSchemasRelayTenantsThroughRabbitMQAcrossKills(t *testing.T) {
	t.Parallel()
	const (
		n        = 4000
		tenants  = 200
		budget   = 5
		kills    = 3
		perTopic = 3
		// writeTime spreads the writes over the kills: a restart prepares
		// 200 tenants' partitions first, seconds on a slow machine.
		writeTime = 15 * time.Second
	)
	ctx := context.Background()
	pattern, tbls := migratedTenants(t, tenants)

	rng := rand.New(rand.NewPCG(5, 6))
	busy := map[string]outbox.Table{}
	for len(busy) < 20 {
		tbl := tbls[rng.IntN(len(tbls))]
		busy[tbl.Schema] = tbl
	}
	var busyList []outbox.Table
	var destinations []string
	for _, tbl := range busy {
		busyList = append(busyList, tbl)
		for k := range perTopic {
			destinations = append(destinations, fmt.Sprintf("%s.topic-%d", tbl.Schema, k))
		}
	}
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_tenants")
	rc := consumeRabbitMQ(t, url, exchange, destinations)

	appName := "sweeper-" + tbls[0].Schema // the test's own
	dbURL := dbtest.NamedURL(t, dbtest.URL(t), appName)
	args := []string{"run", "--database-url", dbURL, "--schemas", pattern, "--producer", "rabbitmq",
		"--rabbitmq-url", url, "--rabbitmq-exchange", exchange, "--destination", "{schema}.{topic}",
		"--max-connections", fmt.Sprint(budget), "--tick", "100ms", "--page-size", "200"}
	procs := []*proc{start(t, nil, args...), start(t, nil, args...)}

	// The budget, sampled until the end: each process's pool and LISTEN
	// session, so two budgets (a killed process's sessions end with it).
	var most atomic.Int64
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for {
			var c int64
			if err := dbtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", appName).Scan(&c); err == nil && c > most.Load() {
				most.Store(c)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})

	var written atomic.Int64
	writerDone := make(chan struct{})
	begin := time.Now()
	go func() {
		defer close(writerDone)
		for i := 0; i < n; {
			tbl := busyList[i%len(busyList)]
			size := min(1+rng.IntN(20), n-i)
			msgs := make([]outbox.Message, size)
			for j := range msgs {
				msgs[j] = outbox.Message{Topic: fmt.Sprintf("topic-%d", (i+j)%perTopic), Payload: fmt.Appendf(nil, "%s/%d", tbl.Schema, i+j),
					Headers: map[string]any{"seq": i + j, "source": "round-trip"}}
			}
			w, err := outbox.NewWriter(tbl)
			if err == nil {
				err = w.Write(ctx, dbtest.Pool(t), msgs...)
			}
			if err != nil {
				t.Errorf("application write: %v", err)
				return
			}
			i += size
			written.Store(int64(i))
			// Paced over writeTime, so that the kills, each after the
			// process to kill has restarted, land while rows still come.
			// The pace decides no outcome: every check waits for every row.
			if ahead := time.Duration(i)*writeTime/n - time.Since(begin); ahead > 0 {
				time.Sleep(ahead)
			}
		}
	}()

	for k := range kills {
		target := (k + 1) * n / (kills + 2)
		dbtest.Eventually(t, 2*time.Minute, fmt.Sprintf("%d rows relayed before kill %d", target, k+1), func() bool { return rc.count() >= target })
		// The process to kill relays every tenant by now (the start prepares
		// each one's partitions first), so the kill lands among its sweeps.
		dbtest.Eventually(t, 2*time.Minute, "the process to kill relaying", func() bool {
			return strings.Contains(procs[0].Stderr(), fmt.Sprintf("relaying outboxes outboxes=%d", tenants))
		})
		require.NoError(t, procs[0].cmd.Process.Kill())
		procs[0].wait(t, time.Minute)
		procs[0] = start(t, nil, args...)
	}
	<-writerDone
	require.False(t, t.Failed(), "the application's writes failed")
	dbtest.Eventually(t, 3*time.Minute, "every row consumed", func() bool {
		for _, tbl := range busyList {
			if dbtest.Outstanding(t, tbl) > 0 {
				return false
			}
		}
		return rc.distinct() >= n
	})
	for _, p := range procs {
		require.Equal(t, 0, p.terminate(t, time.Minute))
	}
	close(stopSampling)
	sampling.Wait()
	rc.drain(t)

	seen := map[float64]int{}
	dups := 0
	for dest, msgs := range rc.snapshot() {
		schema, _, _ := strings.Cut(dest, ".")
		for _, m := range msgs {
			require.True(t, strings.HasPrefix(m.payload, schema+"/"), "row %q arrived under %s", m.payload, dest)
			require.NotEqual(t, -1.0, m.seq, "a header was lost")
			seen[m.seq]++
		}
	}
	for seq := range n {
		c := seen[float64(seq)]
		require.Positive(t, c, "row with seq %d never arrived", seq)
		dups += c - 1
	}
	t.Logf("%d SIGKILLs over %d rows in %d of %d tenants: every row arrived under its tenant; %d more than once; at most %d sessions at once",
		kills, n, len(busy), tenants, dups, most.Load())
	require.LessOrEqual(t, most.Load(), int64(2*budget), "two processes held more than two budgets of connections")
	require.Positive(t, most.Load())
	for _, p := range procs {
		require.NotContains(t, p.Stderr(), "panic")
		require.NotContains(t, p.Stderr(), " ERR ", "a process logged an error")
	}
}

// The binary with --databases-file relays the databases the file lists, and
// on SIGHUP the ones added to it, each database's rows under its name
// (--destination '{database}.{topic}': every outbox is in public). Its
// connection budgets are exported summed (outbox_db_pool_*): each database's
// --max-connections less its LISTEN session.
func TestDatabasesFileIsReadAgainOnSIGHUP(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urls := migratedDatabases(t, 3)
	list := filepath.Join(t.TempDir(), "tenants.txt")
	require.NoError(t, os.WriteFile(list, []byte("# the tenants\n"+urls[0]+"\n"+urls[1]+"\n"), 0o600))
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	p := start(t, nil, "run", "--databases-file", list, "--producer", "stdout", "--admin-addr", addr, "--max-connections", "4",
		"--destination", "{database}.{topic}")
	budget := func(n int) func() bool {
		return func() bool {
			return strings.Contains(scrape(t, addr), fmt.Sprintf("\noutbox_db_pool_max_connections %d\n", n))
		}
	}
	write := func(u, payload string) {
		conn, err := pgx.Connect(ctx, u)
		require.NoError(t, err)
		defer conn.Close(ctx)
		w, err := outbox.NewWriter(outbox.Table{Schema: "public", Name: "outbox"})
		require.NoError(t, err)
		require.NoError(t, w.Write(ctx, conn, outbox.Message{Topic: "orders", Payload: []byte(payload)}))
	}
	// printed reports whether payload was printed, under the name of the
	// database at u.
	printed := func(u, payload string) func() bool {
		cfg, err := pgx.ParseConfig(u)
		require.NoError(t, err)
		return func() bool {
			for _, m := range parseLines(t, p.Lines()) {
				if string(m.Payload) == payload {
					require.Equal(t, cfg.Database+".orders", m.Topic, "row %q sent under another database's name", payload)
					return true
				}
			}
			return false
		}
	}
	write(urls[0], "first")
	write(urls[1], "second")
	dbtest.Eventually(t, time.Minute, "the listed databases' rows", func() bool { return printed(urls[0], "first")() && printed(urls[1], "second")() })
	dbtest.Eventually(t, time.Minute, "two databases' budgets", budget(2*3))

	require.NoError(t, os.WriteFile(list, []byte(urls[0]+"\n"+urls[1]+"\n"+urls[2]+"\n"), 0o600))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	dbtest.Eventually(t, time.Minute, "the added database relayed", func() bool {
		return strings.Count(p.Stderr(), "database relayed") == 3
	})
	write(urls[2], "third")
	dbtest.Eventually(t, time.Minute, "the added database's row", printed(urls[2], "third"))
	dbtest.Eventually(t, time.Minute, "three databases' budgets", budget(3*3))
	require.Equal(t, 0, p.terminate(t, time.Minute))
	require.NotContains(t, p.Stderr(), " ERR ")
}

// With --schemas, the connection budget's pool is exported as a relay of
// one exports its own (outbox_db_pool_*): its size is --max-connections
// less the LISTEN session. The per-tenant series are there for the tenant
// --metrics-outboxes names, and not for the other, healthy one. The gauges
// every tenant shares count them all: a topic tripped in both tenants and
// reset in one is still tripped (one tenant's reset cleared it for both
// before), the relay says it listens, and the lag reads how far the sweeps
// are behind (0 when idle); the table's gauges, which only a relay of one
// refreshes, are not exported (they read 0 for good before).
func TestSchemasExportTheBudgetsPool(t *testing.T) {
	t.Parallel()
	pattern, tbls := migratedTenants(t, 2)
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	p := start(t, nil, "run", "--database-url", dbtest.URL(t), "--schemas", pattern, "--max-connections", "6",
		"--producer", "stdout", "--admin-addr", addr, "--metrics-outboxes", tbls[0].Schema)
	dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { return readyz(addr) == http.StatusOK })
	scrape := func() string { return scrape(t, addr) }
	require.Contains(t, scrape(), "\noutbox_db_pool_max_connections 5\n")
	dbtest.Eventually(t, time.Minute, "the named tenant parked", func() bool {
		return strings.Contains(scrape(), `outbox_tenant_parked{outbox="`+tbls[0].Schema+`"} 1`)
	})
	body := scrape()
	require.Contains(t, body, `outbox_tenant_tripped_topics{outbox="`+tbls[0].Schema+`"} 0`)
	require.Contains(t, body, `outbox_tenant_backlog_messages{outbox="`+tbls[0].Schema+`"} 0`)
	require.Contains(t, body, `outbox_tenant_oldest_message_age_seconds{outbox="`+tbls[0].Schema+`"} 0`)
	require.NotContains(t, body, `outbox="`+tbls[1].Schema+`"`, "a healthy tenant not named has no series")
	dbtest.Eventually(t, time.Minute, "the relay listening", func() bool { return strings.Contains(scrape(), "\noutbox_listening 1\n") })
	require.Contains(t, body, "\noutbox_oldest_outstanding_age_seconds 0\n", "the lag: no tenant's sweeps behind")
	require.NotContains(t, body, "\noutbox_outstanding_messages ", "a gauge no relay of many refreshes")
	require.NotContains(t, body, "\noutbox_dead_letter_messages ", "a gauge no relay of many refreshes")

	post := func(path string) {
		resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(`{"topic":"orders","reason":"by the test"}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	for _, tbl := range tbls {
		post("/outboxes/" + tbl.Schema + "/topics/trip")
	}
	dbtest.Eventually(t, time.Minute, "orders tripped in both tenants", func() bool {
		return strings.Contains(scrape(), "\noutbox_topic_tripped{topic=\"orders\"} 2\n")
	})
	post("/outboxes/" + tbls[1].Schema + "/topics/reset")
	dbtest.Eventually(t, time.Minute, "orders reset in one tenant", func() bool {
		return strings.Contains(scrape(), "\noutbox_topic_tripped{topic=\"orders\"} 1\n")
	})
	require.Equal(t, 0, p.terminate(t, time.Minute))
}

// --awake-rate reaches the fleet, of the database --schemas names and of
// each database --databases lists: a tenant committing 40 times a second,
// which the default (100) leaves asleep, each commit notifying, is kept
// awake under --awake-rate 1: the relay's session holds its awake lock while
// the commits come, and they stop notifying; it lets the lock go once they
// stop. Every row is relayed.
func TestAwakeRateKeepsSlowTenantsAwake(t *testing.T) {
	t.Parallel()
	for _, source := range []string{"schemas", "databases"} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			// The relay's sessions, by a name of this test's own: its
			// tenant's table may have the same name as another test's, in
			// another database.
			name := "awake-rate-" + dbtest.Schema(t)
			var (
				tbl   outbox.Table
				dbURL string
				args  []string
			)
			switch source {
			case "schemas":
				pattern, tbls := migratedTenants(t, 1)
				tbl, dbURL = tbls[0], dbtest.URL(t)
				args = []string{"--database-url", dbtest.NamedURL(t, dbURL, name), "--schemas", pattern}
			case "databases":
				tbl, dbURL = outbox.Table{Schema: "public", Name: "outbox"}, migratedDatabases(t, 1)[0]
				args = []string{"--databases", dbtest.NamedURL(t, dbURL, name)}
			}
			awakeRateKeepsATenantAwake(t, tbl, dbURL, name, args)
		})
	}
}

func awakeRateKeepsATenantAwake(t *testing.T, tbl outbox.Table, dbURL, name string, args []string) {
	ctx := context.Background()
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	p := start(t, nil, append(append([]string{"run"}, args...), "--awake-rate", "1",
		"--producer", "stdout", "--admin-addr", addr)...)
	dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { return readyz(addr) == http.StatusOK })
	holder := func() int32 { return dbtest.AwakeHolder(t, tbl, name) }
	count := dbtest.NotificationsOn(t, dbURL, func(payload string) bool { return payload == tbl.String() })

	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	stop := make(chan struct{})
	var written atomic.Int64
	var writing sync.WaitGroup
	writing.Go(func() {
		// The writer's pace, not a wait for an event: it is the rate under
		// test. Two commits back to back every 50 ms, so that the second
		// notifies while the first's sweep runs (a sweeper wakes up for
		// good only when pressed so); a ticker drops the ticks a slow
		// machine misses, so the rate never passes 40 a second.
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for range 2 {
				if err := w.Write(ctx, pool, outbox.Message{Topic: "orders", Payload: fmt.Appendf(nil, "%d", written.Load())}); err != nil {
					t.Error(err)
					return
				}
				written.Add(1)
			}
		}
	})
	var stopOnce sync.Once
	stopWriting := func() {
		stopOnce.Do(func() { close(stop) })
		writing.Wait()
	}
	t.Cleanup(stopWriting) // before the pool's close and the tenant's drop, whatever fails first

	dbtest.Eventually(t, time.Minute, "the tenant's awake lock held by the relay", func() bool { return holder() != 0 })
	count(nil)
	from := written.Load()
	dbtest.Eventually(t, time.Minute, "40 commits more", func() bool { return written.Load() >= from+40 })
	notified, commits := count(nil), written.Load()-from
	require.Less(t, int64(notified), commits, "every commit notified while the tenant was awake")
	t.Logf("%d notifications for %d commits while awake", notified, commits)
	stopWriting()
	require.False(t, t.Failed(), "the writer failed")
	dbtest.Eventually(t, time.Minute, "every row relayed", func() bool {
		seen := map[string]bool{}
		for _, m := range parseLines(t, p.Lines()) {
			seen[string(m.Payload)] = true
		}
		return len(seen) == int(written.Load())
	})
	dbtest.Eventually(t, time.Minute, "the lock let go once the commits stopped", func() bool { return holder() == 0 })
	require.Equal(t, 0, p.terminate(t, time.Minute))
}

// With --redis-url, each tenant's topic breaker is shared through Redis by
// every process relaying the tenants, and is that tenant's alone: a topic
// tripped by hand in tenant a through one process is tripped in the other
// too, a's rows of it wait in both, and tenant b's topic of the same name
// flows.
func TestSchemasShareEachTenantsBreakerThroughRedis(t *testing.T) {
	t.Parallel()
	pattern, tbls := migratedTenants(t, 2)
	a, b := tbls[0], tbls[1]
	var procs []*proc
	var addrs []string
	for range 2 {
		addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
		addrs = append(addrs, "http://"+addr)
		procs = append(procs, start(t, nil, "run", "--database-url", dbtest.URL(t), "--schemas", pattern,
			"--producer", "stdout", "--admin-addr", addr, "--redis-url", brokertest.RedisURL(t), "--tick", "100ms",
			// The trip outlasts the test: a cooldown that ran out would let
			// the rows it holds back go.
			"--topic-cooldown-ticks", "100000", "--topic-cooldown-max-ticks", "100000"))
		dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { return readyz(addr) == http.StatusOK })
	}
	code, out, errOut := runOnce(t, "topics", "trip", "orders", "--outbox", a.Schema, "--admin-url", addrs[0], "--reason", "a test")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	tripped := func(o outbox.Table, admin string) bool { return trippedIn(t, o, "orders", admin) }
	require.True(t, tripped(a, addrs[1]), "the other process sees a's trip")
	require.False(t, tripped(b, addrs[0]), "b's orders is not a's")
	require.False(t, tripped(b, addrs[1]), "b's orders is not a's")

	write := func(o outbox.Table, topic, payload string) { writeTenant(t, o, topic, payload) }
	printed := func(payload string) bool { return printedBy(t, procs, payload) }
	write(a, "orders", "a-orders")
	write(b, "orders", "b-orders")
	write(a, "invoices", "a-invoices")
	dbtest.Eventually(t, time.Minute, "b's orders and a's invoices", func() bool { return printed("b-orders") && printed("a-invoices") })
	// The sweep that sent a's invoices met a's orders row, written before
	// them, and left it.
	require.False(t, printed("a-orders"), "a's tripped topic was sent")
	// A row is printed before its page commits: a's invoices are
	// outstanding until then.
	dbtest.Eventually(t, time.Minute, "a's orders row alone outstanding", func() bool { return dbtest.Outstanding(t, a) == 1 })

	code, out, errOut = runOnce(t, "topics", "reset", "orders", "--outbox", a.Schema, "--admin-url", addrs[1])
	require.Equal(t, 0, code, "%s%s", out, errOut)
	dbtest.Eventually(t, time.Minute, "a's orders once reset through the other process", func() bool { return printed("a-orders") })
	for _, p := range procs {
		require.Equal(t, 0, p.terminate(t, time.Minute))
		require.NotContains(t, p.Stderr(), " ERR ")
		require.NotContains(t, p.Stderr(), "redis does not answer")
	}
}

// writeTenant commits one row of topic into the outbox o.
func writeTenant(t *testing.T, o outbox.Table, topic, payload string) {
	t.Helper()
	w, err := outbox.NewWriter(o)
	require.NoError(t, err)
	require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: topic, Payload: []byte(payload)}))
}

// printedBy reports whether any of procs has printed a message of payload.
func printedBy(t *testing.T, procs []*proc, payload string) bool {
	t.Helper()
	for _, p := range procs {
		for _, m := range parseLines(t, p.Lines()) {
			if string(m.Payload) == payload {
				return true
			}
		}
	}
	return false
}

// trippedIn reports whether the process whose admin API is at admin lists
// topic of the outbox o as tripped (`sweeper topics list`).
func trippedIn(t *testing.T, o outbox.Table, topic, admin string) bool {
	t.Helper()
	code, out, errOut := runOnce(t, "topics", "list", "--outbox", o.Schema, "--admin-url", admin)
	require.Equal(t, 0, code, "%s%s", out, errOut)
	return strings.Contains(out, topic)
}

// parkedIn reports whether the process whose admin API is at admin lists the
// outbox o as parked (GET /outboxes).
func parkedIn(t *testing.T, o outbox.Table, admin string) bool {
	t.Helper()
	client := http.Client{Timeout: 30 * time.Second} // only bounds a server that never answers
	resp, err := client.Get(admin + "/outboxes")
	require.NoError(t, err)
	defer resp.Body.Close()
	var body struct {
		Outboxes []struct {
			Name   string
			Parked bool
		}
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	for _, b := range body.Outboxes {
		if b.Name == o.Schema {
			return b.Parked
		}
	}
	return false
}

// A Redis outage under --schemas --redis-url stops no tenant: the breakers
// work on local state, every tenant's rows keep flowing and /readyz stays
// ready. Once Redis answers again, a topic an operator tripped through one
// process meanwhile reaches the other; and a tenant whose breaker met the
// outage and then parked (an idle tenant's sweeper does not tick, and a tick
// was where a breaker on local state tried Redis again) goes back to Redis
// by itself, so that a trip made there since, through the other process,
// holds its rows back in both.
func TestSchemasRelayOnThroughARedisOutage(t *testing.T) {
	t.Parallel()
	pattern, tbls := migratedTenants(t, 3)
	a, b := tbls[0], tbls[1]
	redisURL := brokertest.RedisURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, redisURL))
	// The first process reaches Redis through the proxy, the second
	// directly: it sees what reached Redis, and only that.
	var procs []*proc
	var addrs []string
	for _, via := range []string{brokertest.WithHost(t, redisURL, proxy.Addr()), redisURL} {
		addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
		addrs = append(addrs, "http://"+addr)
		procs = append(procs, start(t, nil, "run", "--database-url", dbtest.URL(t), "--schemas", pattern,
			"--producer", "stdout", "--admin-addr", addr, "--redis-url", via, "--tick", "100ms",
			// The trips outlast the test.
			"--topic-cooldown-ticks", "100000", "--topic-cooldown-max-ticks", "100000"))
		dbtest.Eventually(t, 2*time.Minute, "ready", func() bool { return readyz(addr) == http.StatusOK })
	}
	printed := func(payload string) bool { return printedBy(t, procs, payload) }
	flows := func(phase string) {
		t.Helper()
		for _, o := range tbls {
			writeTenant(t, o, "invoices", o.Schema+"-"+phase)
		}
		dbtest.Eventually(t, time.Minute, "every tenant's row "+phase, func() bool {
			for _, o := range tbls {
				if !printed(o.Schema + "-" + phase) {
					return false
				}
			}
			return true
		})
	}
	// logged says the first process logged msg for the outbox o.
	logged := func(o outbox.Table, msg string) bool {
		for line := range strings.Lines(procs[0].Stderr()) {
			if strings.Contains(line, msg) && strings.Contains(line, "outbox="+o.Schema+".outbox") {
				return true
			}
		}
		return false
	}
	flows("before")

	proxy.Refuse(true)
	proxy.Cut()
	flows("during")
	for _, o := range []outbox.Table{a, b} {
		dbtest.Eventually(t, time.Minute, "the outage met in "+o.Schema, func() bool { return logged(o, "redis does not answer") })
	}
	code, out, errOut := runOnce(t, "topics", "trip", "orders", "--outbox", a.Schema, "--admin-url", addrs[0], "--reason", "during the outage")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	require.True(t, trippedIn(t, a, "orders", addrs[0]), "tripped where it was made")
	require.False(t, trippedIn(t, a, "orders", addrs[1]), "the other process cannot know yet")
	require.Equal(t, http.StatusOK, readyz(strings.TrimPrefix(addrs[0], "http://")), "Redis is no reason to stop")
	// Tenant b has nothing more to send: its sweeper parks, and ticks no
	// more.
	dbtest.Eventually(t, time.Minute, "tenant b parked", func() bool { return parkedIn(t, b, addrs[0]) })

	proxy.Refuse(false)
	dbtest.Eventually(t, time.Minute, "a's trip shared once Redis answers", func() bool { return trippedIn(t, a, "orders", addrs[1]) })
	// b's breaker is asked nothing (its sweeper parked, the test calls no
	// API of the first process): the fleet has it try Redis again.
	dbtest.Eventually(t, time.Minute, "b's breaker back on Redis", func() bool { return logged(b, "redis answers again") })
	code, out, errOut = runOnce(t, "topics", "trip", "orders", "--outbox", b.Schema, "--admin-url", addrs[1], "--reason", "after the outage")
	require.Equal(t, 0, code, "%s%s", out, errOut)
	require.True(t, trippedIn(t, b, "orders", addrs[0]), "the first process reads b's trip from Redis")
	for _, o := range []outbox.Table{a, b} {
		writeTenant(t, o, "orders", o.Schema+"-orders")
	}
	flows("after")
	for _, o := range []outbox.Table{a, b} {
		dbtest.Eventually(t, time.Minute, o.Schema+"'s orders row alone outstanding", func() bool { return dbtest.Outstanding(t, o) == 1 })
		require.False(t, printed(o.Schema+"-orders"), "%s's tripped orders was sent", o.Schema)
	}
	for _, p := range procs {
		require.Equal(t, 0, p.terminate(t, time.Minute))
	}
}

// scrape returns the binary's /metrics at addr.
func scrape(t *testing.T, addr string) string {
	t.Helper()
	client := http.Client{Timeout: 30 * time.Second} // only bounds a server that never answers
	resp, err := client.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

// OUTBOX_DATABASES lists the databases as --databases-file does, in a
// variable: every one listed is relayed.
func TestDatabasesVariableRelaysEachListed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	urls := migratedDatabases(t, 2)
	// The second named in the list: its rows go out under that name.
	p := start(t, []string{"OUTBOX_DATABASES=" + urls[0] + "\n eu-1=" + urls[1] + "\n"}, "run", "--producer", "stdout", "--admin-addr", "",
		"--destination", "{database}.{topic}")
	for i, u := range urls {
		conn, err := pgx.Connect(ctx, u)
		require.NoError(t, err)
		w, err := outbox.NewWriter(outbox.Table{Schema: "public", Name: "outbox"})
		require.NoError(t, err)
		require.NoError(t, w.Write(ctx, conn, outbox.Message{Topic: "orders", Payload: fmt.Appendf(nil, "db%d", i)}))
		require.NoError(t, conn.Close(ctx))
	}
	dbtest.Eventually(t, time.Minute, "each listed database's row", func() bool {
		seen := map[string]string{}
		for _, m := range parseLines(t, p.Lines()) {
			seen[string(m.Payload)] = m.Topic
		}
		first, err := url.Parse(urls[0])
		require.NoError(t, err)
		return seen["db0"] == strings.TrimPrefix(first.Path, "/")+".orders" && seen["db1"] == "eu-1.orders"
	})
	require.Equal(t, 0, p.terminate(t, time.Minute))
	require.Equal(t, 2, strings.Count(p.Stderr(), "database relayed"))
}

// migratedDatabases makes n databases, each with its outbox migrated by the
// binary, and returns their URLs.
func migratedDatabases(t *testing.T, n int) []string {
	t.Helper()
	var urls []string
	for range n {
		u := dbtest.Database(t)
		code, out, errOut := runOnce(t, "migrate", "--database-url", u)
		require.Equal(t, 0, code, "%s%s", out, errOut)
		urls = append(urls, u)
	}
	return urls
}
