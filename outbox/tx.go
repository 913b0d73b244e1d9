package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pageTx is a page's transaction, begun in the same round trip as its claim
// (beginWith) rather than in one of its own, as pgx's Begin does, and ended in
// the same round trip as its last statement (commit): a page that succeeds
// costs two round trips. At a few rows a page, a round trip was a third of the
// database's share of a message's latency.
//
// It holds its pooled connection from beginWith to commit or rollback, which
// give it back. A connection given back mid-transaction (a failed rollback) is
// closed by the pool, never reused.
type pageTx struct {
	conn *pgxpool.Conn
	done bool
}

// beginWith acquires a connection and sends BEGIN, the transaction's
// planner settings (txSettings) and the statement sql in one round trip; scan
// reads the statement's rows. On error nothing is left open.
func beginWith(ctx context.Context, pool *pgxpool.Pool, scan func(pgx.Rows) error, sql string, args ...any) (*pageTx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	tx := &pageTx{conn: conn}
	var b pgx.Batch
	b.Queue("begin")
	// The page's first claim gives up on a lock DDL holds, as the listing
	// does (readLockTimeout): nothing is sent yet. The page's later
	// statements (the claims ahead, the moves) wait as long as they must:
	// one that gave up would roll back rows the broker took.
	b.Queue(boundedTxSettings)
	b.Queue(sql, args...).Query(scan)
	b.Queue("SET LOCAL lock_timeout TO DEFAULT")
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		tx.rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// txSettings plans a page's statements (set for its transaction alone, and
// before its claim is planned: a setting the statement made itself would come
// too late for its plan) by index, never by reading the whole table. pgx
// prepares the claim, and after five runs Postgres may keep a generic plan:
// one made while the table was small (a new outbox, statistics from before a
// burst) read it whole, twice a claim, and at 1,000 commits a second with the
// table grown to 20,000 rows a 9-row claim read 976 buffers and took 8 ms. A
// bitmap scan of a topic's candidates never marks the index entries of
// dispatched rows dead, so every claim would step over each of them through
// its heap page until autovacuum comes; a plain index scan marks them the
// first time they are dead to everyone.
//
// Sorts are off too: while something holds the vacuum horizon the outbox is
// a few live rows among hundreds of thousands of dead ones, its statistics say
// a handful of rows, and to the planner any path looks cheap. The soak (issue
// 32) caught it reading a topic's first row by a full scan of the (id) index
// and a sort (392,000 heap fetches, a listing of 10 topics), where the (topic,
// id) index gives that order without one. A statement ordered by an index's
// columns is then read through that index whatever the statistics say.
//
// Plans are generic (plan_cache_mode): the claim runs at every page, and its
// custom plan, made again at each run, cost 0.4 to 0.8 ms of planning a
// 500-row claim that ran in 1 to 2 ms. The settings above keep a generic plan
// on the indexes, and the claim's statement was written for one (its arrays,
// its TID scan; TestAHeldHorizonsStatisticsDoNotMisleadTheSweep checks both
// kinds). JIT is off: a generic plan cannot see the claim's share, so on a
// large outbox its estimates pass jit_above_cost, and each claim compiled its
// plan (10 to 12 ms a claim of a 400,000-row outbox, the drain 2.4 times
// slower). With both, a drain of 100,000 rows ran 5 to 10 % faster
// (BENCHMARKS.md, issue 32).
const txSettings = "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true), " +
	"set_config('enable_sort', 'off', true), set_config('plan_cache_mode', 'force_generic_plan', true), " +
	"set_config('jit', 'off', true)"

// readLockTimeout bounds how long the statements that run outside a page
// (queryPlanned: the listing, the floors' check, the expiry pass) wait for a
// lock on the outbox or its dead-letter table: only DDL takes one that
// blocks them, so a wait is a wedge, not contention between sweeps.
const readLockTimeout = "2s"

// boundedTxSettings is txSettings with readLockTimeout, in the same
// statement: one more in every page's batch and every listing's, each a
// parse and an execution, only for a setting.
const boundedTxSettings = txSettings + ", set_config('lock_timeout', '" + readLockTimeout + "', true)"

// queryPlanned runs sql alone in a transaction under txSettings, in one round
// trip (BEGIN, the settings, the statement, COMMIT); scan reads its rows. It
// is for the statements that read the outbox outside a page (the listing, the
// expiry pass): they need the same plans, and a setting the statement made
// itself would come too late for its plan. The listing runs every sweep, so
// the COMMIT travels with the statement rather than in a round trip of its
// own.
//
// Each is bounded, by dbTimeout and, for a lock, by readLockTimeout: a table
// that DDL holds (VACUUM FULL, ALTER TABLE, LOCK TABLE, a DROP under way)
// made the listing wait for as long as the lock lasted, holding its
// connection and, in a relay of many, a turn that every other outbox of the
// database waited for (an independent review). The sweep fails instead, says
// why, and tries again after its backoff.
func queryPlanned(ctx context.Context, pool *pgxpool.Pool, scan func(pgx.Rows) error, sql string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	tx := &pageTx{conn: conn}
	var b pgx.Batch
	b.Queue("begin")
	b.Queue(boundedTxSettings)
	b.Queue(sql, args...).Query(scan)
	b.Queue("commit")
	if err := conn.SendBatch(ctx, &b).Close(); err != nil {
		tx.rollback(ctx) // a failed statement leaves the transaction open, aborted
		return err
	}
	tx.finish(nil)
	return nil
}

func (tx *pageTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return tx.conn.Exec(ctx, sql, args...)
}

func (tx *pageTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return tx.conn.Query(ctx, sql, args...)
}

func (tx *pageTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return tx.conn.QueryRow(ctx, sql, args...)
}

// errCommitRolledBack says a COMMIT found the transaction aborted: Postgres
// answers it with ROLLBACK, not an error (pgx's Tx does the same check).
var errCommitRolledBack = errors.New("commit unexpectedly resulted in rollback")

// commit commits and gives the connection back. A non-empty sql runs first,
// with args, in the same round trip: the page's last statement travels with
// its COMMIT, as its first travels with its BEGIN (beginWith).
func (tx *pageTx) commit(ctx context.Context, sql string, args ...any) error {
	var b pgx.Batch
	if sql != "" {
		b.Queue(sql, args...)
	}
	var tag pgconn.CommandTag
	b.Queue("commit").Exec(func(ct pgconn.CommandTag) error {
		tag = ct
		return nil
	})
	err := tx.conn.SendBatch(ctx, &b).Close()
	if err == nil && tag.String() == "ROLLBACK" {
		err = errCommitRolledBack
	}
	if err != nil {
		tx.rollback(ctx) // after a failed statement the transaction is still open
		return fmt.Errorf("commit: %w", err)
	}
	tx.finish(nil)
	return nil
}

// rollback rolls back and gives the connection back. After the first call, or
// after commit, it does nothing.
func (tx *pageTx) rollback(ctx context.Context) {
	if tx.done {
		return
	}
	_, err := tx.conn.Exec(ctx, "rollback")
	tx.finish(err)
}

// finish gives the connection back, closing it first if the transaction's
// end failed: its state is then unknown.
func (tx *pageTx) finish(err error) {
	tx.done = true
	if err != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), dbTimeout)
		_ = tx.conn.Conn().Close(closeCtx)
		cancel()
	}
	tx.conn.Release()
}
