package bench_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/fleet"
	"github.com/outbox-sweeper/sweeper/internal/benchutil"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// The tenant benchmarks (issue 33) run the binary with --schemas on a
// database of 1,000 tenant schemas, tenant_0000 to tenant_0999, each an
// outbox migrated by `sweeper migrate --schemas` (about 40 s on the 2-core
// machine, once per go test: each benchmark run clones it, CREATE DATABASE
// … TEMPLATE, in a few seconds). The databases live on the shared server,
// beside the test database, and are dropped at the end; but the latency
// benchmark's, under a drain's sustained load, is on a server of its own with
// initdb's settings (ownTenantDatabase).
const tenantCount = 1000

var (
	tenantTemplateOnce sync.Once
	tenantTemplate     string // the template database's name; "" until made
	tenantTemplateErr  error
	tenantSeq          atomic.Int64
	adminURL           string // the test database's URL, to drop the databases from
)

// makeTenants creates database name on the server base is a URL of, and in
// it the 1,000 tenant schemas, each an outbox migrated by the binary's
// `migrate --schemas`.
func makeTenants(tb testing.TB, bin, base, name string) error {
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		return err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return err
	}
	var sql strings.Builder
	for i := range tenantCount {
		fmt.Fprintf(&sql, "CREATE SCHEMA tenant_%04d;", i)
	}
	conn, err := pgx.Connect(ctx, dbtest.WithDatabase(tb, base, name))
	if err == nil {
		_, err = conn.Exec(ctx, sql.String())
		conn.Close(ctx)
	}
	if err != nil {
		return err
	}
	out, err := exec.Command(bin, "migrate", "--database-url", dbtest.WithDatabase(tb, base, name), "--schemas", "tenant_*").CombinedOutput()
	if err != nil {
		return fmt.Errorf("migrate --schemas: %v\n%s", err, lastLines(out, 5))
	}
	return nil
}

// tenantDatabase returns the URL of a fresh copy of the 1,000-tenant
// database on the shared server, dropped at cleanup.
func tenantDatabase(b *testing.B, bin string) string {
	b.Helper()
	tenantTemplateOnce.Do(func() {
		adminURL = dbtest.URL(b)
		name := fmt.Sprintf("outbox_bench_tenants_%d", os.Getpid())
		tenantTemplate = name // dropped after the benchmarks, if it was made
		tenantTemplateErr = makeTenants(b, bin, adminURL, name)
	})
	if tenantTemplateErr != nil {
		b.Fatalf("the 1,000-tenant database: %v", tenantTemplateErr)
	}
	name := fmt.Sprintf("%s_%d", tenantTemplate, tenantSeq.Add(1))
	ctx := context.Background()
	if _, err := dbtest.Pool(b).Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+tenantTemplate); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dropDatabase(name) })
	return dbtest.WithDatabase(b, adminURL, name)
}

// ownTenantDatabase returns the URL of a 1,000-tenant database on a
// server of the benchmark's own, with initdb's settings, stopped at
// cleanup: for figures under sustained load, which the shared server's
// settings (autovacuum off) and its other databases would skew.
func ownTenantDatabase(b *testing.B, bin string) string {
	b.Helper()
	srv := dbtest.StartDefaultServer(b)
	if err := makeTenants(b, bin, srv.URL(), "tenants"); err != nil {
		b.Fatalf("the 1,000-tenant database on a server of its own: %v", err)
	}
	return dbtest.WithDatabase(b, srv.URL(), "tenants")
}

// dropTenantTemplate drops the template database, if one was made; TestMain
// calls it after the benchmarks.
func dropTenantTemplate() {
	if tenantTemplate != "" {
		dropDatabase(tenantTemplate)
	}
}

func dropDatabase(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "drop database %s: %v\n", name, err)
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
		fmt.Fprintf(os.Stderr, "drop database %s: %v\n", name, err)
	}
}

func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// relay is a run of the sweeper binary as users run it (no admin API, its
// defaults, info logs on stderr), its stdout (the stdout producer's lines)
// read by the benchmark.
type relay struct {
	cmd     *exec.Cmd
	app     string // its sessions' application_name
	admin   string // its admin API's address
	mu      sync.Mutex
	stderr  bytes.Buffer
	lines   atomic.Int64      // messages printed
	onLine  func(line []byte) // set before the rows it looks for are written
	started time.Time
}

func startRelay(b *testing.B, bin, dbURL string, onLine func([]byte), args ...string) *relay {
	b.Helper()
	r := &relay{app: fmt.Sprintf("bench-relay-%d-%d", os.Getpid(), tenantSeq.Add(1)), onLine: onLine,
		admin: fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(b))}
	// The admin API, which nothing calls while a figure is taken, says when
	// a fleet's outboxes have all parked (waitParked).
	r.cmd = exec.Command(bin, append([]string{"run", "--database-url", dbtest.NamedURL(b, dbURL, r.app), "--admin-addr", r.admin, "--producer", "stdout"}, args...)...)
	r.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	r.cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.stderr.Write(p)
	})
	stdout, err := r.cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	r.started = time.Now()
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if r.onLine != nil {
				r.onLine(sc.Bytes())
			}
			r.lines.Add(1)
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	b.Cleanup(func() { _ = r.cmd.Process.Kill(); _ = r.cmd.Wait() })
	return r
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func (r *relay) logs() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stderr.String()
}

// waitParked waits until the fleet relays n outboxes and every one has
// parked (its first sweeps, and any start-up wake, are done), as its admin
// API's GET /outboxes says, and fails b after limit.
func (r *relay) waitParked(b *testing.B, n int, limit time.Duration) {
	b.Helper()
	parked := func() bool {
		resp, err := http.Get(fmt.Sprintf("http://%s/outboxes?limit=%d", r.admin, n))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Total    int
			Outboxes []struct{ Parked bool }
		}
		if json.NewDecoder(resp.Body).Decode(&body) != nil || body.Total != n {
			return false
		}
		for _, o := range body.Outboxes {
			if !o.Parked {
				return false
			}
		}
		return len(body.Outboxes) == n
	}
	// The sleep paces the polling of an event; it decides nothing.
	for deadline := time.Now().Add(limit); !parked(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("the fleet's %d outboxes did not all park within %s:\n%s", n, limit, lastLines([]byte(r.logs()), 20))
		}
	}
}

// waitLog waits for a log line holding s, and fails b after limit. The
// sleep paces the polling of an event; it decides nothing.
func (r *relay) waitLog(b *testing.B, s string, limit time.Duration) {
	b.Helper()
	for deadline := time.Now().Add(limit); !strings.Contains(r.logs(), s); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("the relay did not log %q within %s:\n%s", s, limit, lastLines([]byte(r.logs()), 20))
		}
	}
}

// waitLines waits until the relay has printed n messages, and returns when:
// within 2 ms of the event (the poll's pace), 0.1 % of the shortest drain.
func (r *relay) waitLines(b *testing.B, n int64, limit time.Duration) time.Time {
	b.Helper()
	for deadline := time.Now().Add(limit); r.lines.Load() < n; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d messages printed within %s", r.lines.Load(), n, limit)
		}
	}
	return time.Now()
}

func (r *relay) stop(b *testing.B) {
	b.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	if err := r.cmd.Wait(); err != nil {
		b.Fatalf("relay exit: %v\n%s", err, lastLines([]byte(r.logs()), 20))
	}
}

// cost is what a relay spent over a window: CPU seconds of its process and
// of its database sessions, and its database's transactions (each statement
// outside a transaction is one).
type cost struct {
	procCPU, dbCPU, xacts float64
	window                time.Duration
}

func (c cost) cpuPerSecond() float64   { return (c.procCPU + c.dbCPU) / c.window.Seconds() }
func (c cost) xactsPerSecond() float64 { return c.xacts / c.window.Seconds() }

// clockTicks is Linux's USER_HZ, the unit of /proc/<pid>/stat's times.
const clockTicks = 100

func cpuSeconds(pid int) float64 {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0 // gone: a session closed during the window
	}
	// The command name may hold spaces; the fields after it are fixed.
	fields := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / clockTicks
}

// measure returns what r spends over window on database db.
func (r *relay) measure(b *testing.B, db string, window time.Duration) cost {
	b.Helper()
	ctx := context.Background()
	pool := dbtest.Pool(b)
	xacts := func() float64 {
		var n float64
		if err := pool.QueryRow(ctx, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", db).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	// Postgres counts a session's transactions in pg_stat_database only
	// when the session reports them: at most once a second while it works,
	// and up to 10 s after its last transaction once it is idle
	// (PGSTAT_IDLE_INTERVAL). Read at once, the counter still lacks the
	// start-up's last transactions, which the window's end then counts:
	// 13 transactions a second for a fleet that ran a few in the window.
	time.Sleep(statsReported)
	spent, x0, t0 := r.cpuFrom(b, pool), xacts(), time.Now()
	// The figure is a rate over a window of time: the window's length is
	// what it divides by (the elapsed time measured, not the one asked).
	time.Sleep(window)
	c := spent()
	c.xacts, c.window = xacts()-x0, time.Since(t0)
	return c
}

// cpuFrom starts counting the CPU r spends, in its process and in its
// sessions of the server pool is on, and returns what reads it: the cost
// so far (its window and transactions left to the caller).
func (r *relay) cpuFrom(b *testing.B, pool *pgxpool.Pool) func() cost {
	b.Helper()
	sessions := func() []int {
		rows, err := pool.Query(context.Background(), "SELECT pid FROM pg_stat_activity WHERE application_name = $1", r.app)
		if err != nil {
			b.Fatal(err)
		}
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			b.Fatal(err)
		}
		return pids
	}
	before := map[int]float64{}
	for _, pid := range sessions() {
		before[pid] = cpuSeconds(pid)
	}
	proc0 := cpuSeconds(r.cmd.Process.Pid)
	return func() cost {
		c := cost{procCPU: cpuSeconds(r.cmd.Process.Pid) - proc0}
		for _, pid := range sessions() {
			c.dbCPU += cpuSeconds(pid) - before[pid] // a session opened in the window counts from 0
		}
		return c
	}
}

// idleWindow is how long an idle relay is watched. A fleet is watched once
// every outbox has parked (waitParked); a relay of one outbox once it logs
// that it started. Either window opens statsReported later (see measure): a
// relay of one's start-up (the partitions prepared, the first sweep) is a
// few statements, done well within that on any machine, and what a slower
// machine spends after it is what the window measures.
const (
	idleWindow    = 60 * time.Second
	statsReported = 11 * time.Second
)

// BenchmarkTenantsIdle compares what the binary costs idle relaying 1,000
// tenant schemas (--schemas 'tenant_*') with what it costs relaying one
// table (--schema tenant_0000), on the same database in the same run: CPU of
// the process and of its database sessions, and the database's transactions
// a second. Issue 33's goal: the fleet at most twice the single table.
func BenchmarkTenantsIdle(b *testing.B) {
	bin := build(b, "", "cmd/sweeper")
	for range b.N {
		dbURL := tenantDatabase(b, bin)
		u, _ := url.Parse(dbURL)
		db := strings.TrimPrefix(u.Path, "/")
		fleet := startRelay(b, bin, dbURL, nil, "--schemas", "tenant_*")
		fleet.waitParked(b, tenantCount, 5*time.Minute)
		fc := fleet.measure(b, db, idleWindow)
		fleet.stop(b)
		single := startRelay(b, bin, dbURL, nil, "--schema", "tenant_0000")
		single.waitLog(b, "sweeper started", time.Minute)
		sc := single.measure(b, db, idleWindow)
		single.stop(b)
		b.ReportMetric(1000*fc.cpuPerSecond(), "fleet-cpu-ms/s")
		b.ReportMetric(1000*sc.cpuPerSecond(), "single-cpu-ms/s")
		b.ReportMetric(fc.cpuPerSecond()/sc.cpuPerSecond(), "cpu-fleet/single")
		b.ReportMetric(fc.xactsPerSecond(), "fleet-xacts/s")
		b.ReportMetric(sc.xactsPerSecond(), "single-xacts/s")
		b.ReportMetric(fc.xactsPerSecond()/sc.xactsPerSecond(), "xacts-fleet/single")
		b.ReportMetric(1000*fc.dbCPU/fc.window.Seconds(), "fleet-db-cpu-ms/s")
		b.ReportMetric(1000*sc.dbCPU/sc.window.Seconds(), "single-db-cpu-ms/s")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkTenantsAwakeRate measures what --awake-rate trades, among 1,000
// tenants relayed by one binary: 10, then 20 tenants each committing 50
// single-row transactions a second, under the default (100 a second: each
// of their commits notifies) and under --awake-rate 1 (each kept awake,
// polling, its commits notifying nothing). A commit that notifies takes
// Postgres's notify lock, which every notifying commit of the server
// queues for, one disk flush each (migration 6); an awake tenant's sweeper
// polls every few milliseconds instead. Reported for each: the tenants'
// commit-to-arrival p50 and p99, their commits' own p99 (what the
// application sees), notifications a row, and the CPU of the relay's
// process and sessions, in cores.
func BenchmarkTenantsAwakeRate(b *testing.B) {
	bin := build(b, "", "cmd/sweeper")
	const window = 15 * time.Second
	for range b.N {
		dbURL := ownTenantDatabase(b, bin)
		pool := tenantPool(b, dbURL)
		topics := benchutil.Topics("slow", 3)
		const most = 20
		slowest := tenantTables(1, most)
		// One listener for every phase: a counter left unread keeps its
		// session's queue growing, which notifying commits would pay for.
		notes := notificationsOf(b, dbURL, slowest)
		for _, rate := range []string{strconv.Itoa(fleet.AwakeRateDefault), "1"} {
			var feed payloadFeed
			r := startRelay(b, bin, dbURL, feed.line, "--schemas", "tenant_*", "--awake-rate", rate)
			r.waitParked(b, tenantCount, 5*time.Minute)
			for _, n := range []int{10, most} {
				slow := slowest[:n]
				checkpoint(b, pool)
				notes(nil)
				spent, began := r.cpuFrom(b, pool), time.Now()
				res := benchutil.LatencyTables(b, pool, slow, feed.sub, topics, 50*n, window)
				c := spent()
				c.window = time.Since(began)
				// The harness's warm-up rows (a row a topic and tenant, which
				// the sweepers meet asleep) are counted: 1.004 is every commit.
				k := notes(nil)
				name := fmt.Sprintf("awake%s-%dx50", rate, n)
				b.Logf("--awake-rate %3s, %d tenants at 50 commits/s: p50 %5.1f ms, p99 %5.1f ms, commit p99 %5.1f ms, %.3f notifications a row, relay %.2f cores (%.0f commits/s)",
					rate, n, ms(res.Quantile(0.5)), ms(res.Quantile(0.99)), ms(res.QuantileCommit(0.99)), float64(k)/float64(res.Rows), c.cpuPerSecond(), res.WriteRate)
				b.ReportMetric(ms(res.Quantile(0.5)), name+"-p50-ms")
				b.ReportMetric(ms(res.Quantile(0.99)), name+"-p99-ms")
				b.ReportMetric(ms(res.QuantileCommit(0.99)), name+"-commit-p99-ms")
				b.ReportMetric(float64(k)/float64(res.Rows), name+"-notifications-per-row")
				b.ReportMetric(c.cpuPerSecond(), name+"-relay-cores")
			}
			r.stop(b)
		}
	}
	b.ReportMetric(0, "ns/op")
}

// tenantTables returns the outbox tables of tenant_<from> to tenant_<to>.
func tenantTables(from, to int) []outbox.Table {
	var tbls []outbox.Table
	for i := from; i <= to; i++ {
		tbls = append(tbls, outbox.Table{Schema: fmt.Sprintf("tenant_%04d", i), Name: "outbox"})
	}
	return tbls
}

// notificationsOf counts the notifications naming any of tbls in the
// database at dbURL (dbtest.NotificationsOn).
func notificationsOf(b *testing.B, dbURL string, tbls []outbox.Table) func(marking func()) int {
	return dbtest.NotificationsOn(b, dbURL, func(payload string) bool {
		return slices.ContainsFunc(tbls, func(t outbox.Table) bool { return t.String() == payload })
	})
}

// autovacuumOf samples, every 50 ms until the function it returns is
// called, what the server's autovacuum workers run, and returns then each
// statement with the time it was seen running ("VACUUM tenant_0000.outbox
// 1.2s"): which of a window's stalls fell on a vacuum or an analyze of the
// drain's tables (the outbox's at every hundredth of it, migration 9; the
// history's partitions, written to only by the drain).
func autovacuumOf(b *testing.B, dbURL string) func() string {
	// A session of its own: the writers' pool is the application's.
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	seen := map[string]int{}
	var sampling sync.WaitGroup
	sampling.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			rows, err := conn.Query(ctx, `SELECT regexp_replace(query, '^autovacuum: ', '') FROM pg_stat_activity
				WHERE backend_type = 'autovacuum worker' AND query <> ''`)
			if err == nil {
				qs, _ := pgx.CollectRows(rows, pgx.RowTo[string])
				for _, q := range qs {
					seen[q]++
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			sampling.Wait()
			_ = conn.Close(context.Background())
		})
	}
	b.Cleanup(stop) // a window that fails leaves no sampler behind
	return func() string {
		stop()
		var out []string
		for q, n := range seen {
			out = append(out, fmt.Sprintf("%s %.1fs", q, float64(n)*0.05))
		}
		slices.Sort(out)
		return strings.Join(out, "; ")
	}
}

// payloadFeed hands the payload of each line a relay prints (line, its
// startRelay's onLine) to the function benchutil.LatencyTables subscribes
// (sub, a benchutil.Subscriber) while one is subscribed.
type payloadFeed struct {
	arrived atomic.Pointer[func(body []byte)]
}

func (p *payloadFeed) line(line []byte) {
	if f := p.arrived.Load(); f != nil {
		var m struct{ Payload []byte }
		if err := json.Unmarshal(line, &m); err == nil {
			(*f)(m.Payload)
		}
	}
}

func (p *payloadFeed) sub(_ testing.TB, f func(body []byte)) func() {
	p.arrived.Store(&f)
	return func() { p.arrived.Store(nil) }
}

// loadTenant writes n rows of 512 bytes over 10 topics named prefix.topic-i
// into the outbox table tbl, in statements of 100,000, one transaction.
// The relay sees none of them before the commit, so that the drain starts
// whole (statements committed one by one were drained as they came, and the
// backlog was mostly gone before the window beside it opened).
func loadTenant(b *testing.B, pool *pgxpool.Pool, tbl outbox.Table, prefix string, n int) {
	b.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for i := 0; i < n; i += 100_000 {
		if _, err := tx.Exec(ctx, "INSERT INTO "+tbl.Ident()+
			" (topic, payload) SELECT $1 || '.topic-' || (g % 10), convert_to(repeat('x', 512), 'UTF8') FROM generate_series($2::int, $3::int) g",
			prefix, i, min(i+100_000, n)-1); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTenantsQuietLatency measures, among 1,000 tenants relayed by one
// binary, the commit-to-arrival latency of 10 quiet tenants writing 50
// single-row transactions a second each, in windows of 15 s that take turns:
// alone (no other tenant busy), then beside tenant_0000 draining a backlog of
// 3,000,000 rows, alone again, and so on, nine windows alone and eight
// beside (OUTBOX_BENCH_QUIET_PAIRS pairs), after one alone that is not
// counted (settle, below). Issue 33's goal: the quiet tenants' p99 beside
// the busy one within 1.5 times their p99 alone. Each window beside is held
// against the two alone around it, and the median of those ratios, with an
// interval that holds the true median at 90 % or more, says whether this run
// meets the goal, misses it, or leaves it undecided (paired-p99-ratio-*);
// the pooled ratio (p99-beside/alone) is kept for the figures before.
//
// Why windows that take turns: with one window beside between two alone
// (2026-11-27), a window alone's own p99 ranged from 15 to 59 ms between
// runs of one binary and within a run, and the ratio with it (0.71 to 2.35
// in four runs). The machine's drift over a run now weighs on both sides,
// and each side pools 22,500 rows or more. The per-window p99s are reported
// as a range, which says how far to trust the one ratio, and as a median
// (window-p99-median-beside/alone), which one window's stall does not move.
//
// Between windows the backlog is out of the relay's sight: its table renamed
// (the fleet lets a tenant without an outbox go), vacuumed, and renamed back
// for the next window beside, where a row of its own wakes the fleet to it,
// a new tenant with a backlog to discover and drain, as in the window beside
// of before. Pausing it by tripping its topics left it in sight, and a
// tenant with 3,000,000 tripped rows is no quiet neighbour: its listing read
// 100,000 of them a second (discovery, live_topics.sql) until past them, and
// the check of its floors walked them all, 1.2 s of a statement, once a
// minute (below_floors.sql, which now seeks each topic's first row
// instead); the windows alone read 18.7 to 53.6 ms at p99 with it, 4.3 to
// 8.2 without. The drain's dead rows are vacuumed before
// each window alone, as after the load: autovacuum, which a window's deletes
// set off on the 3M-row table (migration 9), ran through the next window
// alone, and the drain's cost counted as the baseline's.
//
// The backlog comes at once (loadTenant), vacuumed after its load; the
// benchmark fails if it drains before the last window beside ends.
// drained-beside-rows/s says how fast the fleet let it drain beside the
// quiet tenants (fleet/turns.go paces it). It runs on a server of its own
// with initdb's settings (autovacuum on, which the shared server has off),
// each window from a checkpoint. The harness LISTENs beside the relay and
// counts the notifications of each side's windows against its rows
// (*-notifications-per-row; 1.004 when every commit notifies, a window's 30
// warm-up rows included): at 50 commits a second a quiet tenant is under
// the fleet's AwakeRate and each of its commits notifies, queueing behind
// the notify lock (migration 6), so a drain that lengthens the database's
// flushes lengthens that queue.
func BenchmarkTenantsQuietLatency(b *testing.B) {
	bin := build(b, "", "cmd/sweeper")
	const backlog, window = 3_000_000, 15 * time.Second
	pairs := envInt(b, "OUTBOX_BENCH_QUIET_PAIRS", 8)
	for range b.N {
		dbURL := ownTenantDatabase(b, bin)
		quiet := tenantTables(1, 10)
		var feed payloadFeed
		var busyLines atomic.Int64
		r := startRelay(b, bin, dbURL, func(line []byte) {
			if !bytes.Contains(line, []byte(`"topic":"quiet.`)) {
				busyLines.Add(1)
				return
			}
			feed.line(line)
		}, "--schemas", "tenant_*")
		// Every outbox's first sweeps come right after the relay starts: a
		// window alone that opened then measured them too (its p99 was 64
		// and 73 ms in two runs; 46 and 48 ms in two after a 10 s wait).
		r.waitParked(b, tenantCount, 5*time.Minute)
		pool := tenantPool(b, dbURL)
		// The migration of 1,000 tenants left the catalogs' dead rows,
		// which autovacuum came to in the first windows (pg_attribute for 2
		// to 3 s, 2026-11-28): the server's cleanup after the setup, not the
		// drain's cost nor the baseline's.
		if _, err := pool.Exec(context.Background(), "VACUUM (ANALYZE)"); err != nil {
			b.Fatal(err)
		}
		notes := notificationsOf(b, dbURL, quiet)
		topics := benchutil.Topics("quiet", 3)
		// The backlog comes at once, 1.5 GB in one transaction, which no
		// drain's neighbours see in production: a backlog grows over the
		// broker's outage, and autovacuum visits it as it grows (migration
		// 9: at every hundredth). Its first visit of the whole table, and
		// its writes, would fall in a window; the visits the drain's
		// deletes bring still do. It is loaded out of the relay's sight.
		busy := outbox.Table{Schema: "tenant_0000", Name: "outbox"}
		paused := outbox.Table{Schema: "tenant_0000", Name: "outbox_paused"}
		rename := func(from, to outbox.Table) {
			if _, err := pool.Exec(context.Background(), "ALTER TABLE "+from.Ident()+" RENAME TO "+to.Name); err != nil {
				b.Fatal(err)
			}
		}
		rename(busy, paused)
		loadTenant(b, pool, paused, "busy", backlog)
		vacuum(b, pool, paused)

		var alone, beside []benchutil.LatencyResult
		notified := map[string][2]int64{} // a side's notifications and rows
		var drained int64
		var drainedFor time.Duration
		measure := func(name string) benchutil.LatencyResult {
			// Each window starts from a checkpoint: what the server still
			// had to write of the migration (1,000 tenants' tables) or of
			// the backlog's load would otherwise fall in it. Two runs
			// without read 39.5 and 11.9 ms alone at p99.
			checkpoint(b, pool)
			notes(nil)
			vacuumed := autovacuumOf(b, dbURL)
			res := benchutil.LatencyTables(b, pool, quiet, feed.sub, topics, 500, window)
			n := int64(notes(nil))
			b.Logf("%-6s p50 %5.1f ms, p99 %5.1f ms (commit p99 %5.1f, from ack %5.1f), %d notifications of %d commits; autovacuum: %s", name, ms(res.Quantile(0.5)),
				ms(res.Quantile(0.99)), ms(res.QuantileCommit(0.99)), ms(res.QuantileFromAck(0.99)), n, res.Rows, cmp.Or(vacuumed(), "none"))
			side := notified[name]
			notified[name] = [2]int64{side[0] + n, side[1] + int64(res.Rows)}
			return res
		}
		// A window first that is not counted: in seven runs of the binary
		// on one machine (2026-11-28, tenth), the run's first window was
		// the worst window alone in four (the worst of the run in three),
		// commits' p99 up to 68 ms where most later windows' read 1 to 2
		// ms, its stall running on into the first window beside: the
		// server writing back what the setup left (1,000
		// tenants, the backlog's load and vacuum), which falls on the
		// first window alone and so on the baseline. Its figures are
		// logged: in the first three runs with it, 4.9, 6.3 and 21.4 ms
		// at p99 (the last with commits at 12 ms). Neither side reads it.
		measure("settle")
		for i := range pairs {
			alone = append(alone, measure("alone"))
			// The drain resumes: its table back, and a row of its own
			// wakes the fleet to it; the window opens once it has sent a
			// page.
			rename(paused, busy)
			from := busyLines.Load()
			if _, err := pool.Exec(context.Background(), "INSERT INTO "+busy.Ident()+" (topic, payload) VALUES ('busy.topic-0', 'wake')"); err != nil {
				b.Fatal(err)
			}
			dbtest.Eventually(b, time.Minute, "the busy tenant drains again", func() bool { return busyLines.Load() >= from+500 })
			from, began := busyLines.Load(), time.Now()
			beside = append(beside, measure("beside"))
			drained, drainedFor = drained+busyLines.Load()-from, drainedFor+time.Since(began)
			// The rename waits for the drain's page in flight, and its
			// commit; the fleet lets the tenant go at its next sweep.
			rename(busy, paused)
			vacuum(b, pool, paused)
			if i == pairs-1 {
				alone = append(alone, measure("alone"))
			}
		}
		var left int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+paused.Ident()).Scan(&left); err != nil {
			b.Fatal(err)
		}
		if left == 0 {
			b.Fatalf("the busy tenant's backlog of %d rows drained before the last window beside it ended: the figure would not be beside a busy neighbour", backlog)
		}
		r.stop(b)
		// Each side's windows' p99s: their range, and their median, which
		// one window's stall (the machine's, alone as beside) does not move
		// as it moves the pooled p99.
		spread := func(rs []benchutil.LatencyResult) (lo, mid, hi float64) {
			p99s := make([]float64, len(rs))
			for i, r := range rs {
				p99s[i] = ms(r.Quantile(0.99))
			}
			slices.Sort(p99s)
			n := len(p99s)
			return p99s[0], (p99s[(n-1)/2] + p99s[n/2]) / 2, p99s[n-1]
		}
		lo, aloneMid, hi := spread(alone)
		b.ReportMetric(lo, "alone-window-p99-min-ms")
		b.ReportMetric(aloneMid, "alone-window-p99-median-ms")
		b.ReportMetric(hi, "alone-window-p99-max-ms")
		lo, besideMid, hi := spread(beside)
		b.ReportMetric(lo, "beside-window-p99-min-ms")
		b.ReportMetric(besideMid, "beside-window-p99-median-ms")
		b.ReportMetric(hi, "beside-window-p99-max-ms")
		b.ReportMetric(besideMid/aloneMid, "window-p99-median-beside/alone")
		// The goal's verdict: each window beside against the two alone
		// around it (the machine's drift over the run cancels), the median
		// of those ratios, and an interval that holds the true median with
		// 90 % or more, whatever the ratios' distribution. A window's p99
		// rests on a few stalls (a stall of the notify lock delays hundreds
		// of commits at once), so a single ratio, pooled or not, moved from
		// 0.44 to 2.35 between runs of one binary; the interval says
		// whether the goal is met, missed, or not decided by this run.
		p99s := func(rs []benchutil.LatencyResult) []float64 {
			out := make([]float64, len(rs))
			for i, r := range rs {
				out[i] = ms(r.Quantile(0.99))
			}
			return out
		}
		ratios := benchutil.PairedRatios(p99s(alone), p99s(beside))
		b.ReportMetric(reportGoal(b, "p99 beside / alone, each window beside against the two alone around it", "paired-p99-ratio", ratios, 1.5, true),
			"paired-p99-ratio-median")
		all, next := benchutil.MergeLatency(alone...), benchutil.MergeLatency(beside...)
		b.ReportMetric(ms(all.Quantile(0.5)), "alone-p50-ms")
		b.ReportMetric(ms(all.Quantile(0.99)), "alone-p99-ms")
		b.ReportMetric(ms(next.Quantile(0.5)), "beside-busy-p50-ms")
		b.ReportMetric(ms(next.Quantile(0.99)), "beside-busy-p99-ms")
		b.ReportMetric(float64(next.Quantile(0.99))/float64(all.Quantile(0.99)), "p99-beside/alone")
		// Where the tail lies: in the commit itself (the database's flush,
		// a notifying commit's wait for the notify lock) or after it (the
		// wake-up, the turn, the sweep).
		b.ReportMetric(ms(all.QuantileCommit(0.99)), "alone-commit-p99-ms")
		b.ReportMetric(ms(next.QuantileCommit(0.99)), "beside-busy-commit-p99-ms")
		b.ReportMetric(ms(all.QuantileFromAck(0.99)), "alone-from-ack-p99-ms")
		b.ReportMetric(ms(next.QuantileFromAck(0.99)), "beside-busy-from-ack-p99-ms")
		// Whether the quiet tenants' commits notified (each one that does
		// takes Postgres's notify queue lock, held through its commit's WAL
		// flush, so notifying commits of all tenants commit one at a time)
		// or found their sweepers awake.
		for _, side := range []string{"alone", "beside"} {
			if c := notified[side]; c[1] > 0 {
				b.ReportMetric(float64(c[0])/float64(c[1]), side+"-notifications-per-row")
			}
		}
		b.ReportMetric(float64(drained)/drainedFor.Seconds(), "drained-beside-rows/s")
		b.ReportMetric(float64(left), "busy-rows-left")
		b.ReportMetric(next.WriteRate, "quiet-commits/s")
	}
	b.ReportMetric(0, "ns/op")
}

func vacuum(b *testing.B, pool *pgxpool.Pool, t outbox.Table) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), "VACUUM (ANALYZE) "+t.Ident()); err != nil {
		b.Fatal(err)
	}
}

func checkpoint(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	if _, err := pool.Exec(context.Background(), "CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
}

func tenantPool(b *testing.B, dbURL string) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return pool
}

// BenchmarkTenantsDrain drains 100 busy tenants at once, 1,000 rows each
// (100,000 rows of 512 bytes, 10 topics a tenant), among the 1,000 the
// binary relays, against the binary relaying one table of the same 100,000
// rows, in the same run (drainRounds). Issue 33's goal: the fleet at least
// 0.8 of the single table's rate.
func BenchmarkTenantsDrain(b *testing.B) {
	bin := build(b, "", "cmd/sweeper")
	for range b.N {
		drainRounds(b, bin, 100, 1000)
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkTenantsDrainSmallBacklogs drains every one of the 1,000 tenants
// at once, 100 rows each, against one table of the same 100,000 rows: what
// a fleet's recovery from a broker's outage costs when every tenant has
// written a little meanwhile. No goal: each tenant's sweep pays its
// statements (its topics listed, a claim, a move to history) whatever its
// rows, so the fleet drains slower than one table (BENCHMARKS.md, issue 33,
// seventeenth session).
func BenchmarkTenantsDrainSmallBacklogs(b *testing.B) {
	bin := build(b, "", "cmd/sweeper")
	for range b.N {
		drainRounds(b, bin, tenantCount, 100)
	}
	b.ReportMetric(0, "ns/op")
}

// drainRounds drains tenants busy tenants at once, perTenant rows each (512
// bytes, 10 topics a tenant; the last tenants of the 1,000 the binary
// relays), against the binary relaying one table of the same rows: each
// timed from the commit of its rows (written in one transaction) to the
// last message printed.
//
// Each side drains three times, in rounds that take turns (fleet first in
// the first and third, the single table first in the second). A round's
// two drains run within seconds of each other, so fleet/single, the median
// of the rounds' ratios (9 rounds, OUTBOX_BENCH_DRAIN_ROUNDS), with an
// interval that decides the goal, compares them on the machine as it was then; the
// sides' median rates are reported too. One drain of 100,000 rows takes 1
// to 3 s on a 2-core machine, so a second's stall of a slow disk moved a
// side by a third when each drained once: 0.67 to 0.90 in four runs on one
// machine (2026-11-29). Both relays run throughout, each idle while the
// other drains, on separate outboxes (the single table is schema single's,
// which the fleet's pattern does not match): each round's rows are new,
// and neither relay starts, lists or parks inside the other's round.
func drainRounds(b *testing.B, bin string, tenants, perTenant int) {
	b.Helper()
	rounds := envInt(b, "OUTBOX_BENCH_DRAIN_ROUNDS", 9)
	dbURL := tenantDatabase(b, bin)
	pool := tenantPool(b, dbURL)
	if _, err := pool.Exec(context.Background(), "CREATE SCHEMA single"); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command(bin, "migrate", "--database-url", dbURL, "--schema", "single").CombinedOutput(); err != nil {
		b.Fatalf("migrate --schema single: %v\n%s", err, lastLines(out, 5))
	}
	load := func(schemas []string) time.Time {
		tx, err := pool.Begin(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range schemas {
			if _, err := tx.Exec(context.Background(), "INSERT INTO "+pgx.Identifier{s, "outbox"}.Sanitize()+
				" (topic, payload) SELECT 'drain.topic-' || (g % 10), convert_to(repeat('x', 512), 'UTF8') FROM generate_series(1, $1::int) g",
				tenants*perTenant/len(schemas)); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(context.Background()); err != nil {
			b.Fatal(err)
		}
		return time.Now()
	}
	var busy []string
	for i := tenantCount - tenants; i < tenantCount; i++ {
		busy = append(busy, fmt.Sprintf("tenant_%04d", i))
	}
	fleet := startRelay(b, bin, dbURL, nil, "--schemas", "tenant_*")
	single := startRelay(b, bin, dbURL, nil, "--schema", "single")
	fleet.waitParked(b, tenantCount, 5*time.Minute)
	single.waitLog(b, "sweeper started", time.Minute)
	rows := tenants * perTenant
	drain := func(r *relay, schemas []string, round int) float64 {
		// Each drain from a checkpoint, not from what the server still had
		// to write of the drain before.
		checkpoint(b, pool)
		committed := load(schemas)
		took := r.waitLines(b, int64((round+1)*rows), 5*time.Minute).Sub(committed)
		return float64(rows) / took.Seconds()
	}
	var fleetRates, singleRates, ratios []float64
	for i := range rounds {
		var f, s float64
		if i%2 == 0 {
			f = drain(fleet, busy, i)
			// The fleet's sweeps have ended once its tenants have parked.
			fleet.waitParked(b, tenantCount, time.Minute)
			s = drain(single, []string{"single"}, i)
		} else {
			s = drain(single, []string{"single"}, i)
			f = drain(fleet, busy, i)
			fleet.waitParked(b, tenantCount, time.Minute)
		}
		b.Logf("round %d: fleet %.0f msg/s, single %.0f msg/s, fleet/single %.2f", i+1, f, s, f/s)
		fleetRates, singleRates, ratios = append(fleetRates, f), append(singleRates, s), append(ratios, f/s)
	}
	fleet.stop(b)
	single.stop(b)
	b.ReportMetric(median(fleetRates), "fleet-msg/s")
	b.ReportMetric(median(singleRates), "single-msg/s")
	b.ReportMetric(median(ratios), "fleet/single")
	b.ReportMetric(median(fleetRates)/median(singleRates), "median-fleet/median-single")
	// The goal's verdict (fleet/single at least 0.8), whatever the rounds'
	// spread (a slow disk's stall moves one round by a third).
	reportGoal(b, fmt.Sprintf("fleet/single over %d rounds", rounds), "fleet/single", ratios, 0.8, false)
}

// reportGoal logs what ratios say of a goal that their median stay at or
// under goal (atMost) or reach at least goal: the median, an interval that
// holds the true median at 90 % or more whatever their distribution, and the
// verdict, met, missed or undecided. It reports the interval as metric-lo,
// metric-hi and metric-coverage, and returns the median.
func reportGoal(b *testing.B, what, metric string, ratios []float64, goal float64, atMost bool) float64 {
	b.Helper()
	lo, mid, hi, cov := benchutil.MedianInterval(ratios, 0.9)
	verdict, sign := benchutil.Verdict(lo, hi, goal), "<="
	if !atMost {
		verdict, sign = benchutil.VerdictAtLeast(lo, hi, goal), ">="
	}
	b.Logf("%s: %.2f; median %.2f, interval %.2f to %.2f (%.0f %%): goal (%s %g) %s", what, ratios, mid, lo, hi, 100*cov, sign, goal, verdict)
	b.ReportMetric(lo, metric+"-lo")
	b.ReportMetric(hi, metric+"-hi")
	b.ReportMetric(cov, metric+"-coverage")
	return mid
}

// envInt reads a positive count from the environment variable name, or
// gives def when it is not set.
func envInt(b *testing.B, name string, def int) int {
	b.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s is %q: give a whole number, 1 or more", name, v)
	}
	return n
}
