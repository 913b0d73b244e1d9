package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-sweeper/sweeper/outbox/writer"
)

// awakeTimeout bounds each statement on the awake lock's connection: the lock
// is an optimisation, and the sweep loop must not wait long on it.
const awakeTimeout = 5 * time.Second

// awakeKey is the advisory lock a sweeper holds while it sweeps again and again
// on its own, and the outbox's trigger (migration 6) tests before notifying:
// one key per table.
func awakeKey(t Table) int64 { return writer.AdvisoryKey("outbox-sweeper awake " + t.String()) }

// AwakeLock is an outbox's awake lock: the advisory lock a sweeper holds
// while it sweeps again and again on its own, which the outbox's trigger
// tests before it notifies (migration 6). A sweeper of its own holds it on a
// connection of its own; one of a host's (AwakeHost), on the host's session.
// The sweep loop's goroutine alone calls it.
type AwakeLock interface {
	// Acquire tries to take the lock, and reports whether the sweeper holds
	// it. A lock it cannot take (another sweeper holds it, the database does
	// not answer) costs nothing but notifications.
	Acquire(ctx context.Context) bool
	// Release lets the lock go, and returns the ids of the transactions
	// running just after ("" for none), for Settled, and whether the sweeper
	// held it: if it did not, no commit skipped its notification on its
	// account.
	Release(ctx context.Context) (running string, held bool)
	// Settled reports whether every transaction in running has ended, so
	// that a sweep from now on sees every row a commit that did not notify
	// wrote. When it cannot tell, it says true: the rows are then found by
	// the next tick, or the host's reconciliation.
	Settled(ctx context.Context, running string) bool
}

// awakeLock holds the table's awake lock on a connection of its own, so that
// the application's commits do not notify while this sweeper is sweeping
// anyway. A commit that notifies takes a cluster-wide lock until its commit
// record is flushed (migration 6 says why that matters); under a steady
// stream of commits, nearly every one would.
//
// The lock is about latency only. No row is ever lost to it: ticks sweep
// whatever notified or not. A sweeper that cannot take it (another holds it,
// or the connection fails) sweeps as before, and the trigger notifies
// whenever no one holds it. What needs care is letting it go: a commit whose
// trigger saw the lock held did not notify, and may become visible only after
// the sweeper's last sweep, to wait for the next tick. So release returns the
// transactions running just after, and the sweeper sweeps on, at widening
// intervals, until they have all ended (settled) and once more after that,
// before it waits for notifications alone.
//
// It is used by the sweep loop's goroutine only.
type awakeLock struct {
	connConfig *pgx.ConnConfig
	key        int64
	logger     *slog.Logger
	conn       *pgx.Conn
	held       bool
	// failing is set after an error, so that a database that is down logs
	// once, not at every sweep; no connection is tried again before retryAt,
	// so that a connection refused (max_connections reached, say) does not
	// cost every sweep a connection attempt.
	failing bool
	retryAt time.Time
	// checked is when the held lock's connection last answered.
	checked time.Time
}

// awakeCheck is how often an awake sweeper makes sure the lock's connection
// is still there.
const awakeCheck = time.Second

// awakeRetry is how long the awake lock waits after a failure before it
// connects again.
const awakeRetry = 5 * time.Second

func newAwakeLock(connConfig *pgx.ConnConfig, t Table, logger *slog.Logger) *awakeLock {
	return &awakeLock{connConfig: connConfig, key: awakeKey(t), logger: logger}
}

// Acquire tries to take the lock, connecting first if need be, and reports
// whether this sweeper holds it.
func (a *awakeLock) Acquire(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, awakeTimeout)
	defer cancel()
	if a.held {
		// A session that ended (Postgres restarted, a proxy cut it) took
		// the lock with it, and nothing else would tell: a sweeper kept
		// awake by a steady load would go on believing it held it while
		// every commit notified again.
		if time.Since(a.checked) < awakeCheck {
			return true
		}
		if err := a.conn.Ping(ctx); err != nil {
			a.failed("keep the lock (its connection failed)", err)
			return false
		}
		a.checked = time.Now()
		return true
	}
	if a.conn == nil || a.conn.IsClosed() {
		if time.Now().Before(a.retryAt) {
			return false
		}
		conn, err := pgx.ConnectConfig(ctx, a.connConfig)
		if err != nil {
			a.failed("connect to hold the lock", err)
			return false
		}
		keepAlive(ctx, conn, a.logger)
		a.conn = conn
	}
	if err := a.conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", a.key).Scan(&a.held); err != nil {
		a.failed("take the lock", err)
		return false
	}
	a.failing, a.checked = false, time.Now()
	return a.held
}

// Release lets the lock go and returns the ids of the transactions running
// just after, for settled ("" for none), and whether it held the lock: if it
// did not, no commit skipped its notification on its account.
func (a *awakeLock) Release(ctx context.Context) (running string, held bool) {
	if !a.held {
		return "", false
	}
	a.held = false
	ctx, cancel := context.WithTimeout(ctx, awakeTimeout)
	defer cancel()
	// Two statements: what the second reads must be after the unlock. The
	// running transactions are read from pg_stat_activity rather than from a
	// snapshot: a snapshot does not list transactions whose ids are above the
	// last one completed, though they run.
	if _, err := a.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", a.key); err != nil {
		// The session may still hold the lock: end it, which frees it. The
		// rows of commits that did not notify then wait for a tick at most.
		a.failed("release the lock", err)
		return "", true
	}
	if err := a.conn.QueryRow(ctx, runningSQL).Scan(&running); err != nil {
		a.failed("read the transactions running after releasing the lock", err)
		return "", true
	}
	return running, true
}

// Settled reports whether every transaction in running (from Release) has
// ended, so that a sweep from now on sees every row a commit that did not
// notify wrote.
func (a *awakeLock) Settled(ctx context.Context, running string) bool {
	if running == "" || a.conn == nil || a.conn.IsClosed() {
		return true // nothing to wait out, or no way to know: the ticks cover it
	}
	ctx, cancel := context.WithTimeout(ctx, awakeTimeout)
	defer cancel()
	var done bool
	err := a.conn.QueryRow(ctx, settledSQL, running).Scan(&done)
	if err != nil {
		a.failed("check on the transactions running at the release", err)
		return true
	}
	return done
}

// failed logs err once per failing spell and drops the connection, which
// frees the lock if the session still held it.
func (a *awakeLock) failed(what string, err error) {
	a.close()
	a.retryAt = time.Now().Add(awakeRetry)
	if errors.Is(err, context.Canceled) || a.failing {
		return
	}
	a.failing = true
	a.logger.Warn(fmt.Sprintf("awake lock: could not %s; commits go on notifying the sweeper, which costs them more under load; nothing is lost (retrying in %s)", what, awakeRetry), "err", err)
}

// close ends the connection, which frees the lock.
func (a *awakeLock) close() {
	a.held = false
	if a.conn != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = a.conn.Close(closeCtx)
		cancel()
		a.conn = nil
	}
}

// runningSQL lists the transactions running now but the session's own, for
// a release; settledSQL says whether every one of such a list ($1) has ended.
// The list is read from pg_stat_activity rather than from a snapshot: a
// snapshot does not list transactions whose ids are above the last one
// completed, though they run.
const (
	runningSQL = `SELECT coalesce(string_agg(backend_xid::text, ','), '')
		FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()`
	settledSQL = `SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity
		WHERE backend_xid::text = ANY(string_to_array($1, ',')))`
)

// Pacing of an awake sweeper (stayAwake).
const (
	// awakePoll and awakePollMax pace an awake sweeper's sweeps once they find
	// nothing: 1 ms apart, doubling every second empty sweep up to 4 ms.
	// While it holds the lock, commits do not notify: a row committed in a
	// lull waits for the next of these sweeps, so the interval is what a lull
	// adds to latency. Growing it keeps what a lull costs the database low: a
	// sweep that finds nothing is one index probe per topic list
	// (outstanding_topics.sql), about 14 of them to a lull.
	awakePoll    = time.Millisecond
	awakePollMax = 4 * time.Millisecond
	// lingerFor is how long an awake sweeper keeps polling after its last
	// dispatch before it lets the lock go. Shorter, a stream of commits with
	// gaps (a slow disk flush holds them all back at once) would make it let
	// go and take the lock over and over; longer, a trickle of commits keeps
	// it polling for nothing.
	lingerFor = 50 * time.Millisecond
	// settlePollMax caps the interval of the sweeps that wait out the
	// transactions running when the lock went.
	settlePollMax = 100 * time.Millisecond
)

// stayAwake is the sweep loop's state around the awake lock: a sweep that
// dispatches rows makes the sweeper sweep again at once, holding the lock (so
// commits meanwhile need not notify), until sweeps find nothing for a while;
// then it lets the lock go and waits out the transactions running at that
// moment.
type stayAwake struct {
	awake bool
	// settling is set from letting the lock go to the first sweep that began
	// after every transaction in running had ended.
	settling bool
	running  string
	// n counts the sweeps since the last dispatch while awake, or since
	// letting go while settling: the intervals widen with it.
	n    int
	last time.Time // when the last sweep ended
	busy time.Time // when the last sweep that dispatched ended
}

// pollAt returns when the next sweep is due, if the loop should sweep before
// the next tick or notification.
func (st *stayAwake) pollAt() (time.Time, bool) {
	switch {
	case st.awake && st.n == 0:
		return st.last, true // it dispatched: at once
	case st.awake:
		return st.last.Add(min(awakePoll<<(st.n/2), awakePollMax)), true
	case st.settling:
		return st.last.Add(min(time.Millisecond<<st.n, settlePollMax)), true
	}
	return time.Time{}, false
}

// settled reports whether the transactions to wait out have ended; the loop
// asks before a sweep, so that the sweep sees whatever they wrote.
func (st *stayAwake) settled(ctx context.Context, a AwakeLock) bool {
	return !st.settling || a.Settled(ctx, st.running)
}

// swept moves the state on after a sweep: dispatched says whether it sent
// rows, pressed whether commits notified while it ran, busy whether they
// come fast enough to be worth polling for (AwakeHost.Busy; always, for a
// sweeper of its own), settled what st.settled said before it began.
//
// A sweeper wakes up for good only when pressed: at a rate where each commit
// finds it asleep, notifying costs the commits little (nobody queues for the
// lock), and polling would cost the database more than it saves them. And it
// stays awake only while busy: commits that slow to a steady trickle, each
// within lingerFor of the last, would otherwise keep it polling for good.
func (st *stayAwake) swept(ctx context.Context, a AwakeLock, dispatched, pressed, busy, settled bool) {
	st.last = time.Now()
	switch {
	case dispatched && busy && (st.awake || pressed):
		st.awake, st.busy, st.n = true, st.last, 0
		if a.Acquire(ctx) {
			// A wait under way is dropped: the list read when the lock goes
			// next covers whatever is still running then, and the sweep
			// after it what ended before. Not when the lock could not be
			// taken (its session down): its release will read no list.
			st.settling, st.running = false, ""
		}
	case st.awake:
		st.n++
		if st.last.Sub(st.busy) >= lingerFor {
			st.awake, st.n = false, 0
			// A release of a lock not held (taking it failed) read no list,
			// and keeps the wait under way since an earlier release.
			if running, held := a.Release(ctx); held || !st.settling {
				st.running, st.settling = running, held
			}
		}
	case st.settling:
		st.n++
		if settled {
			st.settling, st.running, st.n = false, "", 0
		}
	}
}

// AwakeLock returns outbox t's awake lock, held on the listener's session
// (AwakeHost). Its statements wait for the session between two waits for
// notifications: a fraction of a millisecond, and nothing while the sweeper
// holds it (it does not check the session: the listener pings it, and a
// session lost is a new one, gen, on which the lock is taken again).
func (l *Listener) AwakeLock(t Table) AwakeLock {
	return &sharedAwakeLock{l: l.l, key: awakeKey(t.WithDefaults())}
}

// sharedAwakeLock is an awake lock on a Listener's session. While the
// session is down, it holds nothing: commits notify, and the listener's
// reconnection makes the host look at every parked outbox.
//
// What needs care is that the session is shared and outlives the sweeper's
// spells: a lock it holds that the sweeper does not know of would keep the
// outbox's commits from notifying for as long as the session lives. So the
// lock is taken only if the session does not hold it already (session locks
// stack), and its release always runs, whatever its caller's context: an
// unlock that fails ends the session, which frees it.
type sharedAwakeLock struct {
	l    *listener
	key  int64
	held bool
	gen  uint64 // the session's connection that holds it
	// spell says the lock was held since the last Release, on this
	// connection or one that ended: commits may have skipped their
	// notification, and the release must wait them out.
	spell bool
	// after is the list of transactions to wait out, read once the session
	// is back when the release found it down (runningUnknown).
	after string
}

// runningUnknown is the running list of a release that could not read it:
// Settled reads it when the session is back.
const runningUnknown = "unknown"

func (a *sharedAwakeLock) Acquire(ctx context.Context) bool {
	if a.held && a.current() {
		return true
	}
	a.held = false
	var held bool
	var gen uint64
	err := a.l.do(ctx, false, func(ctx context.Context, conn *pgx.Conn, g uint64) error {
		gen = g
		return conn.QueryRow(ctx, `SELECT CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_locks
				WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted AND objsubid = 1
				  AND ((classid::bigint << 32) | objid::bigint) = $1)
			THEN true ELSE pg_try_advisory_lock($1) END`, a.key).Scan(&held)
	})
	a.held, a.gen = err == nil && held, gen
	a.spell = a.spell || a.held
	return a.held
}

// current reports whether the session is still the connection that took
// the lock.
func (a *sharedAwakeLock) current() bool {
	a.l.mu.Lock()
	defer a.l.mu.Unlock()
	return a.l.up && a.l.gen == a.gen
}

func (a *sharedAwakeLock) Release(ctx context.Context) (running string, held bool) {
	if !a.spell {
		return "", false
	}
	heldOn, wasHeld := a.gen, a.held
	a.held, a.spell, a.after = false, false, ""
	err := a.l.do(ctx, true, func(ctx context.Context, conn *pgx.Conn, gen uint64) error {
		if wasHeld && gen == heldOn {
			// As awakeLock.Release: what the second statement reads must
			// be after the unlock.
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", a.key); err != nil {
				// The session may still hold it: end the session, which
				// frees it (the listener connects again).
				closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				defer cancel()
				_ = conn.Close(closeCtx)
				return err
			}
		}
		// On a connection that is not the one that held it, the lock went
		// with that one; the transactions that skipped their notification
		// meanwhile and still run are among those running now.
		return conn.QueryRow(ctx, runningSQL).Scan(&running)
	})
	if err != nil {
		// The session is down or failing: the list is read when it is back.
		return runningUnknown, true
	}
	return running, true
}

func (a *sharedAwakeLock) Settled(ctx context.Context, running string) bool {
	if running == runningUnknown {
		if a.after == "" {
			err := a.l.do(ctx, false, func(ctx context.Context, conn *pgx.Conn, _ uint64) error {
				return conn.QueryRow(ctx, runningSQL).Scan(&a.after)
			})
			if err != nil {
				return false // the session is still down: asked again at the next sweep
			}
			if a.after == "" {
				return true
			}
		}
		running = a.after
	}
	if running == "" {
		return true
	}
	var done bool
	err := a.l.do(ctx, false, func(ctx context.Context, conn *pgx.Conn, _ uint64) error {
		return conn.QueryRow(ctx, settledSQL, running).Scan(&done)
	})
	if errors.Is(err, errNoSession) {
		return false // asked again at the next sweep, once the session is back
	}
	return err != nil || done
}
