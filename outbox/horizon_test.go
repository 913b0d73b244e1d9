package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
	outboxsql "github.com/outbox-sweeper/sweeper/sql"
)

// While something holds the vacuum horizon, the outbox is a few live rows
// among many dead ones, and a vacuum then leaves statistics that mislead the
// planner: the table holds a handful of rows (the live ones), its indexes
// hundreds of thousands of entries (the dead ones too), so that any index scan,
// even a whole index's, looks like a page or two. Issue 32's soak caught the
// relay falling from 3,000 rows/s to 250 that way: the claim locked its rows
// by id through a full scan of the (topic, id) index, and the listing read
// each topic's first row by a sequential scan, then by a full scan of the (id)
// index and a sort. This builds those statistics (reltuples asserted, so the
// test knows it has them) and checks the plans that cannot go wrong whatever
// the statistics say: the claim's lock and the page's move are TID scans, and
// no statement of a sweep sorts or reads the table whole. Then the relay
// delivers, the horizon still held.
func TestAHeldHorizonsStatisticsDoNotMisleadTheSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	name := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec("ALTER TABLE " + name + " SET (autovacuum_enabled = false)")
	// Dead rows vacuum may remove, so that its pass over the indexes counts
	// what is left in them.
	churn := func(rows int) {
		exec("INSERT INTO "+name+" (topic, payload) SELECT 'topic-' || (g % 10), '\\x00' FROM generate_series(1, $1) g", rows)
		exec("DELETE FROM " + name + " WHERE id <= (SELECT max(id) - 60 FROM " + name + ")")
	}
	churn(2_000)

	report, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer func() { _ = report.Rollback(ctx) }()
	var seen int
	require.NoError(t, report.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&seen))
	for range 15 {
		churn(10_000)
	}
	// The statistics a vacuum leaves while the horizon is held, written
	// directly: whether a vacuum of this test's table gets to make them
	// depends on every other session of the server (its pass over the indexes,
	// which counts their entries, runs only if it can remove something).
	exec("UPDATE pg_class SET reltuples = 60 WHERE oid = $1::regclass", name)
	exec("UPDATE pg_class SET reltuples = 150060 WHERE oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $1::regclass)", name)

	topics := topicNames(10)
	var floor int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT min(id) - 1 FROM "+name).Scan(&floor))
	floors := make([]int64, len(topics))
	for i := range floors {
		floors[i] = floor
	}
	claim := outboxsql.Statement("claim_page", outboxsql.Tables{Outbox: ident(tbl)})
	listing := outboxsql.Statement("live_topics", outboxsql.Tables{Outbox: ident(tbl)})
	for _, generic := range []bool{false, true} {
		mode := map[bool]string{false: "force_custom_plan", true: "force_generic_plan"}[generic]
		c := explain(t, pool, mode, claim, topics, floors, make([]int64, len(topics)), 50, false, "20000ms")
		require.Equal(t, 60, c.rows("LockRows"), c.text)
		require.Equal(t, []string{"Tid Scan"}, c.under("LockRows"), "the claim locks its rows by ctid:\n%s", c.text)
		c.noneOf(t, "Seq Scan", "Sort", "Bitmap Heap Scan")
		require.Less(t, c.buffers, 1_500, "the claim read more than its rows and their index entries:\n%s", c.text)

		l := explain(t, pool, mode, listing, topics, floors, floor, 1000, floor)
		l.noneOf(t, "Seq Scan", "Sort", "Bitmap Heap Scan")
		require.Less(t, l.buffers, 1_500, "the listing read more than its probes:\n%s", l.text)
	}

	// And the relay delivers every live row, the horizon still held.
	prod := memory.New(memory.Config{})
	s := newSweeper(t, pool, prod, outbox.Config{Table: tbl})
	dbtest.RunSweeper(t, s)
	dbtest.Eventually(t, time.Minute, "the 60 live rows sent", func() bool { return len(prod.Messages()) >= 60 })
	dbtest.Eventually(t, time.Minute, "the 60 rows moved", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	var still int
	require.NoError(t, report.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&still))
	require.Equal(t, seen, still, "the report's snapshot was held all along")
}

// A connection keeps a statement's generic plan until the table's statistics
// change, so a quiet outbox's claim and expiry, first run while it held a few
// rows, ran with plans made for a few rows when an outage left a backlog:
// plans that scanned a partial index whole and filtered on ctid, which the
// planner prefers to a TID scan on a small table. A 500-row claim of 100,000
// rows read 78,000 buffers (345 ms) until autovacuum analyzed the table. This
// plans both statements on a table analyzed at 10 rows, grows it to 20,000
// rows without a new analysis, and runs the same prepared statements again:
// each locks by ctid, and reads its rows, not the table. The rows are of 512
// bytes, as the benchmarks' are: with 1-byte payloads the server planned the
// statements again after the growth, for a reason not found, and the old
// statements passed.
func TestPlansMadeWhileTheOutboxWasSmallStayOnTheirRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	name := ident(tbl)
	insert := func(rows int) {
		t.Helper()
		_, err := pool.Exec(ctx, "INSERT INTO "+name+" (topic, payload) SELECT 'topic-' || (g % 10), convert_to(repeat('x', 512), 'UTF8') FROM generate_series(1, $1) g", rows)
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, "ALTER TABLE "+name+" SET (autovacuum_enabled = false)")
	require.NoError(t, err)
	insert(10)
	_, err = pool.Exec(ctx, "ANALYZE "+name)
	require.NoError(t, err)

	topics := topicNames(10)
	zeros := make([]int64, len(topics))
	ages := make([]int64, len(topics))
	whys := make([]string, len(topics))
	for i := range topics {
		ages[i], whys[i] = 3_600_000, "expired"
	}
	statements := []struct {
		name, sql string
		args      []any
	}{
		{"small_claim", outboxsql.Statement("claim_page", outboxsql.Tables{Outbox: ident(tbl)}), []any{topics, zeros, zeros, 50, false, "20000ms"}},
		{"small_expire", outboxsql.Statement("expire", outboxsql.Tables{Outbox: ident(tbl), DeadLetter: tbl.DeadLetterIdent()}), []any{topics, ages, 1000, whys}},
	}

	// One connection throughout: the plans are its own.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	run := func(f func(tx pgx.Tx)) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, outbox.TxSettings)
		require.NoError(t, err)
		f(tx)
	}
	for _, st := range statements {
		_, err := conn.Exec(ctx, "PREPARE "+st.name+" AS "+st.sql)
		require.NoError(t, err)
		defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE "+st.name) }()
		run(func(tx pgx.Tx) { explainExecute(t, tx, st.name, st.args...) }) // planned now, for 10 rows
	}
	insert(20_000)
	for _, st := range statements {
		run(func(tx pgx.Tx) {
			p := explainExecute(t, tx, st.name, st.args...)
			var generic int
			require.NoError(t, tx.QueryRow(ctx, "SELECT generic_plans FROM pg_prepared_statements WHERE name = $1", st.name).Scan(&generic))
			require.Equal(t, 2, generic, "%s: both runs generic", st.name)
			require.Equal(t, []string{"Tid Scan"}, p.under("LockRows"), "%s locks its rows by ctid:\n%s", st.name, p.text)
			require.Less(t, p.buffers, 2_500, "%s read more than its rows and their index entries:\n%s", st.name, p.text)
			if st.name == "small_claim" {
				require.Equal(t, 500, p.rows("LockRows"), p.text)
			}
		})
	}
}

// topicNames returns topic-0 … topic-(n-1), the topics the tests' inserts
// spread their rows over ('topic-' || (g % n)).
func topicNames(n int) []string {
	topics := make([]string, n)
	for i := range topics {
		topics[i] = fmt.Sprintf("topic-%d", i)
	}
	return topics
}

// explained numbers explain's prepared statements.
var explained atomic.Int64

// plan is what EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) said of a statement.
type plan struct {
	root    map[string]any
	buffers int // shared blocks hit and read, the whole statement
	text    string
}

// explain runs sql with args under the page's planner settings and plan_cache_mode
// mode, in a transaction it rolls back, and returns its plan.
//
// The statement is prepared and its plan is that of EXECUTE, as pgx's
// statements are: an EXPLAIN of the statement given its arguments would plan
// them as constants, a custom plan whatever mode says. The arguments go as
// literals (the simple protocol), which EXECUTE casts to the statement's
// parameter types.
func explain(t *testing.T, pool interface {
	Begin(context.Context) (pgx.Tx, error)
}, mode, sql string, args ...any) plan {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, outbox.TxSettings)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SET LOCAL plan_cache_mode = "+mode)
	require.NoError(t, err)
	name := fmt.Sprintf("explained_%d", explained.Add(1))
	_, err = tx.Exec(ctx, "PREPARE "+name+" AS "+sql)
	require.NoError(t, err)
	defer func() { _, _ = tx.Exec(ctx, "DEALLOCATE "+name) }() // PREPARE outlives the transaction
	p := explainExecute(t, tx, name, args...)
	var generic, custom int
	require.NoError(t, tx.QueryRow(ctx, "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1", name).Scan(&generic, &custom))
	require.Equal(t, mode == "force_generic_plan", generic > 0 && custom == 0, "%s, yet %d generic plans and %d custom", mode, generic, custom)
	return p
}

// explainExecute runs the statement prepared as name with args, and returns
// its plan.
func explainExecute(t *testing.T, tx pgx.Tx, name string, args ...any) plan {
	t.Helper()
	params := make([]string, len(args))
	for i := range args {
		params[i] = fmt.Sprintf("$%d", i+1)
	}
	var out []byte
	require.NoError(t, tx.QueryRow(context.Background(), "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE "+name+"("+strings.Join(params, ", ")+")",
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...).Scan(&out))
	var doc []struct {
		Plan map[string]any `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(out, &doc))
	p := plan{root: doc[0].Plan, text: string(out)}
	p.buffers = int(num(p.root["Shared Hit Blocks"]) + num(p.root["Shared Read Blocks"]))
	return p
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

// walk calls f on every node of the plan, init plans and CTEs included.
func (p plan) walk(f func(node map[string]any)) {
	var visit func(n map[string]any)
	visit = func(n map[string]any) {
		f(n)
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			if m, ok := k.(map[string]any); ok {
				visit(m)
			}
		}
	}
	visit(p.root)
}

// noneOf fails if any node of the plan is one of types.
func (p plan) noneOf(t *testing.T, types ...string) {
	t.Helper()
	p.walk(func(n map[string]any) {
		for _, ty := range types {
			require.NotEqual(t, ty, n["Node Type"], "the plan has a %s:\n%s", ty, p.text)
		}
	})
}

// under returns the node types of the children of the first node of type
// parent that are scans of a relation (init plans left out).
func (p plan) under(parent string) []string {
	var out []string
	done := false
	p.walk(func(n map[string]any) {
		if done || n["Node Type"] != parent {
			return
		}
		done = true
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			m, _ := k.(map[string]any)
			if m != nil && m["Relation Name"] != nil {
				out = append(out, m["Node Type"].(string))
			}
		}
	})
	return out
}

// rows returns the actual rows of the first node of type ty.
func (p plan) rows(ty string) int {
	rows := -1
	p.walk(func(n map[string]any) {
		if rows < 0 && n["Node Type"] == ty {
			rows = int(num(n["Actual Rows"]))
		}
	})
	return rows
}

// The page's statements run with JIT off. Their plans are generic (the
// settings force them: a custom plan cost a planning of 0.4 to 0.8 ms a claim,
// a tenth of a drain's database time), and a generic plan cannot see the
// claim's share, so on a large outbox its estimates pass jit_above_cost: each
// 500-row claim of a 400,000-row outbox then compiled its plan, 10 to 12 ms
// for a claim that runs in 1 to 2 ms, and the drain took 9.4 s where it took
// 3.9. Here jit_above_cost is 0, so that every plan would be compiled were JIT
// on: the claim and the listing are not, the control is.
func TestPageStatementsAreNeverCompiled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	var available bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_jit_available()").Scan(&available))
	require.True(t, available, "this server cannot compile plans (no LLVM JIT), so the test cannot tell JIT off from JIT missing: run it against Postgres with its llvmjit module")
	name := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	_, err := pool.Exec(ctx, "INSERT INTO "+name+" (topic, payload) SELECT 'topic-' || (g % 10), '\\x00' FROM generate_series(1, 1000) g")
	require.NoError(t, err)

	topics := []string{"topic-0", "topic-1", "topic-2"}
	claim := outboxsql.Statement("claim_page", outboxsql.Tables{Outbox: ident(tbl)})
	listing := outboxsql.Statement("live_topics", outboxsql.Tables{Outbox: ident(tbl)})
	compiled := func(settings bool, sql string, args ...any) bool {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, "SET LOCAL jit = on; SET LOCAL jit_above_cost = 0")
		require.NoError(t, err)
		if settings {
			_, err = tx.Exec(ctx, outbox.TxSettings)
			require.NoError(t, err)
		}
		var out []byte
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&out))
		var doc []map[string]any
		require.NoError(t, json.Unmarshal(out, &doc))
		_, ok := doc[0]["JIT"]
		return ok
	}
	claimArgs := []any{topics, []int64{0, 0, 0}, []int64{1, 2, 3}, 50, false, "20000ms"}
	require.True(t, compiled(false, claim, claimArgs...), "the control: without the page's settings the claim is compiled")
	require.False(t, compiled(true, claim, claimArgs...), "the claim was compiled under the page's settings")
	require.False(t, compiled(true, listing, topics, []int64{0, 0, 0}, 0, 1000, 0), "the listing was compiled under the page's settings")
}
