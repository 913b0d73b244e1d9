package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// With ticks an hour apart, only a wake-up on commit can deliver a row before
// the hour is out; with notify off, the same row waits for the tick.
func TestCommitWakesTheSweeper(t *testing.T) {
	t.Parallel()
	for _, notify := range []bool{true, false} {
		t.Run(fmt.Sprintf("notify=%v", notify), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			app := "wake-test-" + tbl.Schema
			// A row written before Run: its delivery shows the first tick,
			// which comes at once, is over.
			writeMessages(t, tbl, topicMessages("first", 1)...)
			prod := memory.New(memory.Config{})
			stop := dbtest.RunSweeper(t, newSweeper(t, dbtest.NamedPool(t, app), prod,
				outbox.Config{Table: tbl, Tick: time.Hour, DisableNotify: !notify}))
			defer stop()
			dbtest.Eventually(t, patience, "the first tick", func() bool { return len(prod.Messages()) == 1 })
			if notify {
				dbtest.Eventually(t, patience, "the sweeper listening", func() bool { return len(listenerSessions(t, app)) == 1 })
				// The listener sweeps once when it connects; a sentinel row
				// makes sure that sweep is over, so the rows below can only
				// go through a notification.
				writeMessages(t, tbl, topicMessages("sentinel", 1)...)
				dbtest.Eventually(t, patience, "the sentinel sent", func() bool { return len(prod.Messages()) == 2 })
			}

			start := time.Now()
			writeMessages(t, tbl, topicMessages("woken", 3)...)
			if !notify {
				// No session listens, so no commit can wake the sweeper:
				// the rows wait for the tick, an hour away.
				require.Empty(t, listenerSessions(t, app), "no listen connection")
				require.Equal(t, 3, dbtest.Outstanding(t, tbl), "without notify, rows wait for the tick")
				return
			}
			dbtest.Eventually(t, patience, "the rows sent", func() bool { return len(prod.Messages()) == 5 })
			t.Logf("commit to broker: %s", time.Since(start))
			// Sent a moment before their batch commits.
			dbtest.Eventually(t, patience, "every row marked dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
		})
	}
}

// listenerSessions returns the pids of sessions named app (any, if empty) that
// LISTEN for the outbox.
func listenerSessions(t *testing.T, app string) []int32 {
	t.Helper()
	rows, err := dbtest.Pool(t).Query(context.Background(),
		`SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN '||$1 AND ($2 = '' OR application_name = $2)`,
		outbox.NotifyChannel, app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	return pids
}

// The trigger fires per statement and Postgres folds a transaction's
// notifications into one: 1,000 rows written at once, or three inserts in one
// transaction, make one notification; a rollback makes none.
func TestOneNotificationPerCommit(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	count := dbtest.Notifications(t, tbl)

	// Postgres folds a transaction's identical notifications, so the count
	// alone would not tell a row trigger from a statement one: ask the catalog
	// (bit 0 of tgtype is TRIGGER_TYPE_ROW).
	var forEachRow bool
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT tgtype & 1 = 1 FROM pg_trigger WHERE tgname = $1 AND tgrelid = $2::regclass",
		tbl.Name+"_notify", pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()).Scan(&forEachRow))
	require.False(t, forEachRow, "the trigger must fire once per statement")

	writeMessages(t, tbl, topicMessages("bulk", 1000)...) // COPY: one statement
	require.Equal(t, 1, count(nil), "a 1,000-row write")

	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	pool := dbtest.Pool(t)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for range 3 {
			if err := w.Write(ctx, tx, topicMessages("three", 1)...); err != nil {
				return err
			}
		}
		return nil
	}))
	require.Equal(t, 1, count(nil), "three inserts in one transaction")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, tx, topicMessages("rolled-back", 1)...))
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, 0, count(nil), "a rolled-back insert")
}

// While a sweeper holds the awake lock (it is sweeping again and again on its
// own), commits do not notify, so they take no cluster-wide lock. When it lets
// the lock go, it learns which transactions were running, and it is settled
// only once they have ended: a row written while the lock was held and
// committed after it went, which notified no one, is still swept at once.
//
// Both kinds of lock: a sweeper's own, and a host's on its LISTEN session
// (each lock on a Listener of its own, as two relays have theirs: a session
// takes an advisory lock it holds again).
func TestCommitsDoNotNotifyWhileASweeperIsAwake(t *testing.T) {
	t.Parallel()
	for kind, newLock := range awakeLockKinds() {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			commitsDoNotNotifyWhileAwake(t, func(tbl outbox.Table) outbox.AwakeLock {
				return newLock(t, dbtest.Pool(t).Config().ConnConfig.Copy(), tbl, true)
			})
		})
	}
}

// awakeLockKinds makes each kind of awake lock: on a connection of its own,
// or on a Listener's session, started for it (and waited for, if up).
func awakeLockKinds() map[string]func(t *testing.T, cfg *pgx.ConnConfig, tbl outbox.Table, up bool) outbox.AwakeLock {
	return map[string]func(t *testing.T, cfg *pgx.ConnConfig, tbl outbox.Table, up bool) outbox.AwakeLock{
		"own": func(t *testing.T, cfg *pgx.ConnConfig, tbl outbox.Table, _ bool) outbox.AwakeLock {
			l := outbox.NewAwakeLock(cfg, tbl)
			t.Cleanup(l.Close)
			return l
		},
		"listener": func(t *testing.T, cfg *pgx.ConnConfig, tbl outbox.Table, up bool) outbox.AwakeLock {
			l := outbox.NewListener(cfg, slog.New(slog.DiscardHandler), func(string) {}, func() {})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); l.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			if up {
				dbtest.Eventually(t, patience, "the listener's session up", func() bool { return outbox.ListenerUp(l) })
			}
			return l.AwakeLock(tbl)
		},
	}
}

func commitsDoNotNotifyWhileAwake(t *testing.T, lock func(outbox.Table) outbox.AwakeLock) {
	tbl := dbtest.Table(t)
	ctx := context.Background()
	pool := dbtest.Pool(t)
	count := dbtest.Notifications(t, tbl)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)

	awake, other := lock(tbl), lock(tbl)
	require.True(t, awake.Acquire(ctx))
	require.False(t, other.Acquire(ctx), "one sweeper holds it at a time")
	require.True(t, lock(outbox.Table{Schema: tbl.Schema, Name: "other_outbox"}).Acquire(ctx),
		"another outbox has a lock of its own")

	writeMessages(t, tbl, topicMessages("quiet", 1)...)
	require.Equal(t, 0, count(nil), "a commit while a sweeper is awake")

	// A writer that wrote while the lock was held, still running when it goes.
	writer, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = writer.Rollback(ctx) }()
	require.NoError(t, w.Write(ctx, writer, topicMessages("straddling", 1)...))

	running, held := awake.Release(ctx)
	require.True(t, held)
	require.NotEmpty(t, running)
	require.True(t, other.Acquire(ctx), "free once released")
	_, held = other.Release(ctx)
	require.True(t, held)
	_, held = other.Release(ctx)
	require.False(t, held, "released twice")
	require.False(t, awake.Settled(ctx, running), "the writer is still running")
	// A transaction that began after the release does not hold it up.
	later, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = later.Rollback(ctx) }()
	_, err = later.Exec(ctx, "SELECT pg_current_xact_id()")
	require.NoError(t, err)
	require.NoError(t, writer.Commit(ctx))
	// Other transactions running at the release (other tests') end too.
	dbtest.Eventually(t, patience, "settled once the writer has ended", func() bool { return awake.Settled(ctx, running) })
	require.Equal(t, 0, count(nil), "its commit notified no one: the sweep after settling is what finds its row")

	writeMessages(t, tbl, topicMessages("woken", 1)...)
	require.Equal(t, 1, count(nil), "with no sweeper awake, a commit notifies again")
}

// A listen connection that Postgres ends is opened again, and commits wake the
// sweeper again; the ticks, an hour apart here, play no part.
func TestLostListenConnectionIsReestablished(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	app := "notify-test-" + tbl.Schema
	prod := memory.New(memory.Config{})
	stop := dbtest.RunSweeper(t, newSweeper(t, dbtest.NamedPool(t, app), prod, outbox.Config{Table: tbl, Tick: time.Hour}))
	defer stop()

	var first []int32
	dbtest.Eventually(t, patience, "the sweeper listening", func() bool {
		first = listenerSessions(t, app)
		return len(first) == 1
	})
	var ok bool
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", first[0]).Scan(&ok))
	require.True(t, ok)
	dbtest.Eventually(t, patience, "a new listen connection", func() bool {
		now := listenerSessions(t, app)
		return len(now) == 1 && now[0] != first[0]
	})

	// As in TestCommitWakesTheSweeper, a sentinel outlasts the sweep made on
	// reconnecting.
	writeMessages(t, tbl, topicMessages("sentinel", 1)...)
	dbtest.Eventually(t, patience, "the sentinel sent", func() bool { return len(prod.Messages()) == 1 })
	writeMessages(t, tbl, topicMessages("after-reconnect", 5)...)
	dbtest.Eventually(t, patience, "the rows sent", func() bool { return len(prod.Messages()) == 6 })
}

// Under OrderingTopic a topic whose lock another sweeper holds is not sent at
// all, while other topics go on; once the lock is free, it is.
func TestTopicOrderingSendsATopicFromOneSweeperAtATime(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, append(topicMessages("held", 50), topicMessages("free", 50)...)...)
	ctx := context.Background()

	// Another sweeper, as far as Postgres can tell, sending a batch of "held".
	other, err := dbtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx)
	_, err = other.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", tbl.TopicLockKey("held"))
	require.NoError(t, err)

	// The query of docs/concepts.md ("Several instances") finds who holds a
	// topic.
	var holder, otherPID int32
	require.NoError(t, other.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&otherPID))
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory'
		AND (classid::bigint << 32 | objid::bigint) = $1`, tbl.TopicLockKey("held")).Scan(&holder))
	require.Equal(t, otherPID, holder)

	prod := memory.New(memory.Config{MaxBatch: 10})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 50, res.Dispatched, "only the free topic")
	require.Positive(t, res.Skipped)
	for _, m := range prod.Messages() {
		require.Equal(t, "free", m.Topic)
	}

	require.NoError(t, other.Rollback(ctx))
	res, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 50, res.Dispatched)
	require.Zero(t, dbtest.Outstanding(t, tbl))
}

// Rows another sweeper holds: under OrderingTopic the topic waits for them, so
// nothing overtakes them; under OrderingNone the rest of the topic is sent.
func TestOrderingNoneSendsAroundRowsHeldElsewhere(t *testing.T) {
	t.Parallel()
	for _, ordering := range []outbox.Ordering{outbox.OrderingTopic, outbox.OrderingNone} {
		t.Run(string(ordering), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			writeMessages(t, tbl, topicMessages("shared", 100)...)
			ctx := context.Background()

			other, err := dbtest.Pool(t).Begin(ctx)
			require.NoError(t, err)
			defer other.Rollback(ctx)
			_, err = other.Exec(ctx, fmt.Sprintf("SELECT id FROM %s ORDER BY id LIMIT 10 FOR UPDATE",
				pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()))
			require.NoError(t, err)

			prod := memory.New(memory.Config{MaxBatch: 25})
			s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Ordering: ordering})
			res, err := s.Sweep(ctx)
			require.NoError(t, err)
			if ordering == outbox.OrderingTopic {
				require.Zero(t, res.Dispatched, "the first batch waits for the held rows, and the rest waits for it")
			} else {
				require.Equal(t, 90, res.Dispatched)
				require.Equal(t, 10, res.Skipped)
			}

			require.NoError(t, other.Rollback(ctx))
			_, err = s.Sweep(ctx)
			require.NoError(t, err)
			require.Zero(t, dbtest.Outstanding(t, tbl))
			seen := map[int64]bool{}
			for _, m := range prod.Messages() {
				require.False(t, seen[m.ID], "row %d sent twice", m.ID)
				seen[m.ID] = true
			}
			require.Len(t, seen, 100)
		})
	}
}

// Wake-up sweeps leave the cooldowns to the ticks: a topic tripped for one tick
// stays out however many commits wake the sweeper, while the other topics go.
func TestWakeUpsDoNotShortenCooldowns(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	app := "cooldown-test-" + tbl.Schema
	topics := breaker.New(breaker.Settings{CooldownTicks: 1})
	prod := memory.New(memory.Config{})
	sweeps := &sweepCounter{}
	stop := dbtest.RunSweeper(t, newSweeper(t, dbtest.NamedPool(t, app), prod,
		outbox.Config{Table: tbl, Tick: time.Hour, TopicBreaker: topics, Observer: sweeps}))
	defer stop()
	dbtest.Eventually(t, patience, "the sweeper listening", func() bool { return len(listenerSessions(t, app)) == 1 })
	// Run's first sweep is a tick: trip after it, or its OnTick would end the
	// one-tick cooldown.
	dbtest.Eventually(t, patience, "the first tick's sweep", func() bool { return sweeps.n.Load() > 0 })
	topics.Trip("held", "test")
	// A sweep may have begun before the trip (the listener signals once when
	// it connects) and list its topics after rows below are written, with a
	// plan that has no trip. A sentinel sent and committed shows any such
	// sweep is past its listing: from here on, every sweep began after the trip.
	writeMessages(t, tbl, topicMessages("sentinel", 1)...)
	dbtest.Eventually(t, patience, "the sentinel sent and committed", func() bool { return dbtest.Outstanding(t, tbl) == 0 })

	for i := range 5 {
		writeMessages(t, tbl, append(topicMessages("held", 1), topicMessages("free", 1)...)...)
		dbtest.Eventually(t, patience, "the free row sent", func() bool { return len(prod.Messages()) == i+2 })
	}
	for _, m := range prod.Messages()[1:] {
		require.Equal(t, "free", m.Topic)
	}
	require.Equal(t, breaker.StateTripped, topics.State("held"))
	// The last free row reaches the producer a moment before its batch commits.
	dbtest.Eventually(t, patience, "only the held rows outstanding", func() bool { return dbtest.Outstanding(t, tbl) == 5 })
}

// sweepCounter is an Observer that counts sweeps.
type sweepCounter struct {
	ignored
	n atomic.Int64
}

func (c *sweepCounter) SweepDone(time.Duration) { c.n.Add(1) }

// An awake sweeper lets its lock go only after the transactions running at that
// moment have ended, and sweeps once more: a row whose statement saw the lock
// held (so its commit notifies no one) and that commits after the lock went is
// sent at once, not at the next tick, an hour away here.
func TestAwakeSweeperLeavesNoRowForTheTick(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	pool := dbtest.Pool(t)
	held := func() bool { return awakeHolder(t, tbl) != 0 }
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	count := dbtest.Notifications(t, tbl)
	prod := memory.New(memory.Config{})
	app := "awake-" + tbl.Schema
	stop := dbtest.RunSweeper(t, newSweeper(t, dbtest.NamedPool(t, app), prod, outbox.Config{Table: tbl, Tick: time.Hour}))
	defer stop()
	sent := func(payload string) bool {
		for _, m := range prod.Messages() {
			if string(m.Payload) == payload {
				return true
			}
		}
		return false
	}

	// Each attempt presses the sweeper awake with commits back to back, writes
	// a row while it holds the lock, and commits it once the lock has gone.
	// An attempt counts only if that commit notified no one (the lock was not
	// let go and taken again between the row's insert and the check after it).
	for attempt := 1; ; attempt++ {
		require.LessOrEqual(t, attempt, 10, "no attempt wrote its row while the sweeper held the lock")
		stopPressing := pressCommits(t, w)
		dbtest.Eventually(t, patience, "the sweeper awake", held)
		straddler, err := pool.Begin(ctx)
		require.NoError(t, err)
		// Before the schema's drop, which its locks would block, should the
		// test fail with it open.
		t.Cleanup(func() { _ = straddler.Rollback(ctx) })
		payload := fmt.Sprintf("straddling-%d", attempt)
		require.NoError(t, w.Write(ctx, straddler, outbox.Message{Topic: "straddling", Payload: []byte(payload)}))
		wroteWhileHeld := held()
		stopPressing()
		if !wroteWhileHeld {
			require.NoError(t, straddler.Rollback(ctx))
			continue
		}
		count(nil) // what the pressing commits sent
		dbtest.Eventually(t, patience, "the sweeper letting the lock go", func() bool { return !held() })
		// The lock may also look free while an awake sweeper failed to take
		// it; what shows that this one let it go and is waiting out the
		// straddler is its connection asking after running transactions.
		dbtest.Eventually(t, patience, "the sweeper waiting out the running transactions", func() bool {
			var waiting bool
			require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE application_name = $1 AND query LIKE '%backend_xid::text = ANY%')`, app).Scan(&waiting))
			return waiting
		})
		require.NoError(t, straddler.Commit(ctx))
		if count(nil) != 0 {
			continue // it notified after all: sent, but not by the path under test
		}
		dbtest.Eventually(t, patience, "the row sent without a notification or a tick", func() bool { return sent(payload) })
		t.Logf("attempt %d", attempt)
		return
	}
}

// The awake lock's connection ending (Postgres restarted, a proxy cut it)
// frees the lock with it: commits notify again, nothing waits for the tick (an
// hour away), and the sweeper takes the lock again on a new connection.
func TestLostAwakeConnectionLosesNothing(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	pool := dbtest.Pool(t)
	holder := func() int32 { return awakeHolder(t, tbl) }
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	prod := memory.New(memory.Config{})
	stop := dbtest.RunSweeper(t, newSweeper(t, dbtest.NamedPool(t, "awake-lost-"+tbl.Schema), prod, outbox.Config{Table: tbl, Tick: time.Hour}))
	defer stop()

	var written atomic.Int64
	press := func() (stop func()) { return pressCommits(t, w, &written) }
	sentAll := func() bool {
		return dbtest.Outstanding(t, tbl) == 0 && len(prod.Messages()) >= int(written.Load())
	}

	stopPressing := press()
	var first int32
	dbtest.Eventually(t, patience, "the sweeper holding the awake lock", func() bool { first = holder(); return first != 0 })
	var ok bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", first).Scan(&ok))
	require.True(t, ok)
	dbtest.Eventually(t, patience, "the lock gone with its session", func() bool { return holder() == 0 })
	before := written.Load()
	dbtest.Eventually(t, patience, "more commits after the loss", func() bool { return written.Load() > before+10 })
	stopPressing()
	dbtest.Eventually(t, patience, "every row sent, the tick an hour away", sentAll)

	// Pressed again, it takes the lock on a new connection.
	stopPressing = press()
	dbtest.Eventually(t, patience, "the lock held again, on a new connection", func() bool {
		pid := holder()
		return pid != 0 && pid != first
	})
	stopPressing()
	dbtest.Eventually(t, patience, "every row sent", sentAll)
}

// awakeHolder returns the pid of the session holding tbl's awake lock, 0 for
// none. It reads pg_locks rather than trying the lock, which for a moment
// would keep a sweeper from taking it.
func awakeHolder(t *testing.T, tbl outbox.Table) int32 {
	t.Helper()
	var pid int32
	err := dbtest.Pool(t).QueryRow(context.Background(), `SELECT pid FROM pg_locks WHERE locktype = 'advisory'
		AND granted AND mode = 'ExclusiveLock' AND objsubid = 1
		AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid`,
		outbox.AwakeKeyOf(tbl)).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return pid
}

// pressCommits commits rows through w back to back, each in a transaction of
// its own, over three topics, counting them in written (if set), until the
// returned function is called: faster than a sweep, so the sweeper stays awake.
func pressCommits(t *testing.T, w *outbox.Writer, written ...*atomic.Int64) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			if err := pgx.BeginFunc(context.Background(), dbtest.Pool(t), func(tx pgx.Tx) error {
				return w.Write(context.Background(), tx, outbox.Message{Topic: fmt.Sprintf("press-%d", i%3), Payload: fmt.Appendf(nil, "press-%d", i)})
			}); err != nil {
				done <- err
				return
			}
			for _, n := range written {
				n.Add(1)
			}
		}
		done <- nil
	}()
	return func() { cancel(); require.NoError(t, <-done) }
}

// An awake lock that cannot reach the database is harmless: it holds nothing,
// has nothing to wait out, and the sweeper sweeps as without it.
func TestAwakeLockWithoutADatabaseHoldsNothing(t *testing.T) {
	t.Parallel()
	for kind, newLock := range awakeLockKinds() {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			cfg := dbtest.Pool(t).Config().ConnConfig.Copy()
			cfg.Port = 1 // nothing listens there
			cfg.ConnectTimeout = time.Second
			l := newLock(t, cfg, dbtest.Table(t), false)
			ctx := context.Background()
			require.False(t, l.Acquire(ctx))
			require.False(t, l.Acquire(ctx), "again, within the retry's wait")
			running, held := l.Release(ctx)
			require.False(t, held)
			require.Empty(t, running)
			require.True(t, l.Settled(ctx, running))
		})
	}
}

// A Listener's session takes an awake lock it holds already without holding
// it twice (session locks stack): a release that did not run, and the next
// spell's acquire on top of it, would otherwise leave it held after that
// spell's release, and the outbox's commits would notify no more for as long
// as the session lives. Here two handles of one outbox on one session stand
// for the lost release and the next spell.
func TestAListenersAwakeLockDoesNotStack(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	l := outbox.NewListener(dbtest.Pool(t).Config().ConnConfig.Copy(), slog.New(slog.DiscardHandler), func(string) {}, func() {})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	dbtest.Eventually(t, patience, "the listener's session up", func() bool { return outbox.ListenerUp(l) })

	lost, next := l.AwakeLock(tbl), l.AwakeLock(tbl)
	require.True(t, lost.Acquire(ctx))
	require.True(t, next.Acquire(ctx), "the session holds it")
	_, held := next.Release(ctx)
	require.True(t, held)
	other := outbox.NewAwakeLock(dbtest.Pool(t).Config().ConnConfig.Copy(), tbl)
	defer other.Close()
	require.True(t, other.Acquire(ctx), "free once the next spell released it")
}

// The sessions that LISTEN and hold awake locks ask the server to probe them
// when idle (TCP keepalives), so that after a network partition the server
// ends the session the client gave up on, and its awake lock with it, within
// half a minute rather than the system's two hours.
func TestLongIdleSessionsAreProbed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := dbtest.Pool(t).Config().ConnConfig.Copy()
	if cfg.Host == "" || cfg.Host[0] == '/' {
		t.Fatalf("the test database is reached over a Unix socket (%q), where keepalives do not apply: give a TCP address", cfg.Host)
	}
	l := outbox.NewListener(cfg, slog.New(slog.DiscardHandler), func(string) {}, func() {})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); l.Run(runCtx) }()
	defer func() { cancel(); <-done }()
	dbtest.Eventually(t, patience, "the listener's session up", func() bool { return outbox.ListenerUp(l) })
	own := outbox.NewAwakeLock(cfg, dbtest.Table(t))
	defer own.Close()
	require.True(t, own.Acquire(ctx))
	for setting, want := range map[string]string{"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"} {
		got, err := outbox.ListenerSetting(ctx, l, setting)
		require.NoError(t, err)
		require.Equal(t, want, got, "the listener's %s", setting)
		got, err = own.Setting(ctx, setting)
		require.NoError(t, err)
		require.Equal(t, want, got, "the own awake lock's %s", setting)
	}
}

// awakeHost is a wakingHost whose outbox is always busy enough to stay awake
// (AwakeHost), with a lock that only records whether it is held.
type awakeHost struct {
	wakingHost
	lock *recordedLock
}

func (h awakeHost) AwakeLock() outbox.AwakeLock { return h.lock }
func (awakeHost) Busy(int) bool                 { return true }

type recordedLock struct{ held, taken atomic.Int32 }

func (l *recordedLock) Acquire(context.Context) bool {
	l.held.Store(1)
	l.taken.Add(1)
	return true
}

func (l *recordedLock) Release(context.Context) (string, bool) { return "", l.held.Swap(0) == 1 }
func (*recordedLock) Settled(context.Context, string) bool     { return true }

// A hosted sweeper that parks while awake keeps polling until it lets its
// lock go: while the lock is held, commits do not notify, and a parked
// sweeper that waited for a wake-up alone would hold it, its outbox's commits
// silent, until the host's reconciliation. Its polls once counted only before
// the next tick, which a parked sweeper never waits for: the cursor's reread
// poll, a quarter of a second later, rescued most such parks, not those whose
// last sweep had read again (sweepAt's test proves the rule itself).
func TestAParkedAwakeSweeperPollsUntilItLetsItsLockGo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	prod := memory.New(memory.Config{})
	host := awakeHost{wakingHost: wakingHost{wake: make(chan struct{}, 1)}, lock: &recordedLock{}}
	s := newSweeper(t, pool, prod, outbox.Config{Table: tbl, Tick: 2 * time.Millisecond, Host: host})
	// Findings settle at once, so that the cursor's reread polls, which come
	// whether parked or not, stop soon after the row.
	outbox.SetCursorReset(s, time.Hour)
	outbox.SetCursorSettle(s, time.Nanosecond)
	dbtest.RunSweeper(t, s)
	dbtest.Eventually(t, 30*time.Second, "the empty outbox parked", s.Parked)

	// A commit that notifies while the sweep sends presses the sweeper: it
	// wakes up for good, and takes the lock.
	prod.SetSendFunc(func(context.Context, producer.Batch) error {
		host.poke()
		return nil
	})
	_, err := pool.Exec(ctx, "INSERT INTO "+ident(tbl)+" (topic, payload) VALUES ('orders', 'x')")
	require.NoError(t, err)
	host.poke()
	dbtest.Eventually(t, 30*time.Second, "the sweeper awake, holding its lock", func() bool { return host.lock.taken.Load() > 0 })
	prod.SetSendFunc(nil)

	// Nothing more is written: it finds nothing, parks, and lets the lock go
	// once it has polled for lingerFor (50 ms) without sending.
	dbtest.Eventually(t, 30*time.Second, "the lock let go and the outbox parked", func() bool {
		return host.lock.held.Load() == 0 && s.Parked()
	})
	require.Len(t, prod.Messages(), 1)
}
