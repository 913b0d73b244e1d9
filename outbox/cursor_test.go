package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
	outboxsql "github.com/outbox-sweeper/sweeper/sql"
)

// delivered reports whether p has accepted a message with payload body.
func delivered(p *memory.Producer, body string) bool {
	for _, m := range p.Messages() {
		if string(m.Payload) == body {
			return true
		}
	}
	return false
}

// cursorSweeper runs a sweeper on an outbox of its own whose cursor never
// resets, so that only the floors' rules can find a row; settle is how long
// its findings wait (settleAfter in production). It returns the outbox, its
// quoted name, the pool, what the sweeper sent and the sweeper.
func cursorSweeper(t *testing.T, settle time.Duration) (tbl outbox.Table, name string, pool *pgxpool.Pool, prod *memory.Producer, s *outbox.Sweeper) {
	t.Helper()
	tbl = dbtest.Table(t)
	pool = dbtest.Pool(t)
	prod = memory.New(memory.Config{})
	s = newSweeper(t, pool, prod, outbox.Config{Table: tbl, Tick: 5 * time.Millisecond})
	outbox.SetCursorReset(s, time.Hour)
	outbox.SetCursorSettle(s, settle)
	dbtest.RunSweeper(t, s)
	return tbl, pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize(), pool, prod, s
}

// Ids are drawn at insert and rows commit in any order: a row whose
// transaction commits after rows with higher ids have been sent must still be
// sent, though the topic's floor has moved past those rows. The cursor's reset
// is turned off, so only the floors' own rule (wait for the transactions the
// snapshot saw running) can find it; it is found while the sweeper keeps
// sending other rows of the same topic, and of a topic the sweeper first sees
// in it.
func TestCursorFindsRowsCommittedOutOfIdOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl, name, pool, prod, _ := cursorSweeper(t, 0) // the transactions' rule alone

	for round := range 3 {
		// An open transaction draws its ids first: one for a topic the sweeper
		// knows, one for a topic it has never seen.
		late, err := pool.Begin(ctx)
		require.NoError(t, err)
		known, fresh := fmt.Sprintf("late-known-%d", round), fmt.Sprintf("late-fresh-%d", round)
		_, err = late.Exec(ctx, "INSERT INTO "+name+" (topic, payload) VALUES ('orders', $1), ('new-"+fmt.Sprint(round)+"', $2)",
			[]byte(known), []byte(fresh))
		require.NoError(t, err)

		// Rows with higher ids commit and are sent, several sweeps' worth, so
		// that the floors move past the open transaction's ids.
		for i := range 20 {
			body := fmt.Sprintf("after-%d-%d", round, i)
			_, err := pool.Exec(ctx, "INSERT INTO "+name+" (topic, payload) VALUES ('orders', $1)", []byte(body))
			require.NoError(t, err)
			dbtest.Eventually(t, 30*time.Second, body+" sent", func() bool { return delivered(prod, body) })
		}
		require.False(t, delivered(prod, known), "a row of an open transaction was sent")

		require.NoError(t, late.Commit(ctx))
		dbtest.Eventually(t, 30*time.Second, "the rows committed after higher ids were sent", func() bool {
			return delivered(prod, known) && delivered(prod, fresh)
		})
	}
	// The broker has a page's rows a moment before the page's end moves them
	// to history and commits.
	dbtest.Eventually(t, 30*time.Second, "every row moved", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
}

// While a REPEATABLE READ transaction holds the vacuum horizon (a report,
// pg_dump), no dead row version can be removed, and a sweep that read each
// topic from its lowest id would visit every row sent since the hold began,
// again at every sweep. Rows keep arriving, and the floors keep moving to the
// rows the last sweeps sent: a read-only snapshot does not hold the cursor
// back, since it runs no transaction id.
func TestCursorMovesWhileTheHorizonIsHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl, name, pool, _, s := cursorSweeper(t, time.Second) // as in production

	report, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer report.Rollback(ctx)
	var seen int
	require.NoError(t, report.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&seen))

	topics := []string{"a", "b", "c"}
	for round := range 10 {
		var first int64
		for i := range 300 {
			var id int64
			require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+name+" (topic, payload) VALUES ($1, $2) RETURNING id",
				topics[i%len(topics)], fmt.Appendf(nil, "%d-%d", round, i)).Scan(&id))
			if i == 0 {
				first = id
			}
		}
		dbtest.Eventually(t, time.Minute, fmt.Sprintf("round %d sent", round), func() bool {
			return dbtest.Outstanding(t, tbl) == 0
		})
		if round < 2 {
			continue
		}
		// The floors follow the sends: every topic's floor reaches this
		// round's rows once its transactions are known to have ended, which
		// the next sweeps (a row written wakes them) show.
		dbtest.Eventually(t, time.Minute, fmt.Sprintf("the floors to pass round %d's first row %d", round, first), func() bool {
			_, err := pool.Exec(ctx, "INSERT INTO "+name+" (topic, payload) VALUES ('tick', '\\x00')")
			require.NoError(t, err)
			members, discovery := outbox.Floors(s)
			for _, tp := range topics {
				f, ok := members[tp]
				if !ok {
					f = discovery
				}
				if f < first {
					return false
				}
			}
			return true
		})
	}
	var still int
	require.NoError(t, report.QueryRow(ctx, "SELECT count(*) FROM "+name).Scan(&still))
	require.Equal(t, seen, still, "the report's snapshot was held all along")
}

// The table's health names what holds the horizon: here a REPEATABLE READ
// transaction of this test, by its pid.
func TestTableHealthNamesTheHorizonHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	report, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	defer report.Rollback(ctx)
	var pid int
	require.NoError(t, report.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	// A transaction that starts after the report's moves the horizon on
	// everywhere else, so the report is the oldest holder.
	_, err = pool.Exec(ctx, "SELECT pg_current_xact_id()")
	require.NoError(t, err)

	var reportAge int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&reportAge))

	h, err := outbox.ReadTableHealth(ctx, pool, tbl)
	require.NoError(t, err)
	require.Positive(t, h.Bytes)
	require.NotNil(t, h.Horizon, "a report holds the horizon")
	// Other tests' transactions may be older than the report: the holder is
	// the oldest, so at least as old as the report (whose age only grows).
	require.GreaterOrEqual(t, h.Horizon.XminAge, reportAge)
	require.NotEmpty(t, h.Horizon.Who)
	require.NotEmpty(t, h.Horizon.Kind)
}

// An INSERT draws its row's id before its transaction gets an id of its own,
// so for a moment the row belongs to no transaction a snapshot sees running.
// Here that moment is stretched: the id is drawn (nextval) in a transaction
// that has written nothing, rows after it are sent, and only then is the row
// written with that id. The floors wait settleAfter besides the transactions'
// rule, so the row is still found; the reset is off, so nothing else would.
func TestCursorFindsARowWhoseIdWasDrawnBeforeItsTransactionStarted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, name, pool, prod, _ := cursorSweeper(t, time.Minute) // longer than this test's stall, however slow the machine

	stalled, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer stalled.Rollback(ctx)
	var id int64
	var xid *string
	for {
		require.NoError(t, stalled.QueryRow(ctx, "SELECT nextval(pg_get_serial_sequence($1, 'id')), pg_current_xact_id_if_assigned()::text",
			name).Scan(&id, &xid))
		if xid == nil {
			break // drawn with no transaction id, as an INSERT's first row is
		}
		// nextval took one to log the sequence ahead (once in 32 draws):
		// start again.
		require.NoError(t, stalled.Rollback(ctx))
		stalled, err = pool.Begin(ctx)
		require.NoError(t, err)
	}
	for i := range 20 {
		body := fmt.Sprintf("after-%d", i)
		_, err := pool.Exec(ctx, "INSERT INTO "+name+" (topic, payload) VALUES ('orders', $1)", []byte(body))
		require.NoError(t, err)
		dbtest.Eventually(t, 30*time.Second, body+" sent", func() bool { return delivered(prod, body) })
	}
	_, err = stalled.Exec(ctx, "INSERT INTO "+name+" (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES ($1, 'orders', 'stalled')", id)
	require.NoError(t, err)
	require.NoError(t, stalled.Commit(ctx))
	dbtest.Eventually(t, 30*time.Second, "the row whose id was drawn first sent", func() bool { return delivered(prod, "stalled") })
}

// The floors are checked beside the sweeps, and forgotten only when a row lies
// below them: a row copied back by hand with its own id is sent, and until one
// is, the sweeps keep reading from their floors however many checks pass (a
// cursor that forgot its floors on a clock made the next sweep walk every dead
// entry below them, per topic and per page: issue 32's soak caught a 3 s stall
// that way as a held snapshot ended).
func TestCursorForgetsItsFloorsOnlyForARowPutBackBelowThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	_, name, prod, s, last, lowest := checkedEvery20ms(t, 30)
	before := outbox.FloorChecks(s)
	dbtest.Eventually(t, time.Minute, "five checks of the floors", func() bool { return outbox.FloorChecks(s) >= before+5 })
	require.GreaterOrEqual(t, lowest(), last, "the floors were forgotten with no row below them")

	// A sent row copied back with its own id, far below every floor.
	_, err := pool.Exec(ctx, "INSERT INTO "+name+" (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES (1, 'a', 'back')")
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "the row put back sent", func() bool { return delivered(prod, "back") })
}

// checkedEvery20ms runs a sweeper of a table of its own whose floors are
// checked every 20 ms and settle at once; it sends rows of topic 'a' until
// the floors have passed them, and returns the last one's id, with the
// lowest of the floors as it stands at each call.
func checkedEvery20ms(t *testing.T, rows int) (tbl outbox.Table, name string, prod *memory.Producer, s *outbox.Sweeper, last int64, lowest func() int64) {
	t.Helper()
	ctx := context.Background()
	tbl = dbtest.Table(t)
	pool := dbtest.Pool(t)
	prod = memory.New(memory.Config{})
	s = newSweeper(t, pool, prod, outbox.Config{Table: tbl, Tick: 5 * time.Millisecond})
	outbox.SetCursorReset(s, 20*time.Millisecond) // a check every 20 ms
	outbox.SetCursorSettle(s, 0)
	dbtest.RunSweeper(t, s)
	name = pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	lowest = func() int64 {
		members, discovery := outbox.Floors(s)
		low := discovery
		for _, f := range members {
			low = min(low, f)
		}
		return low
	}
	for i := range rows {
		body := fmt.Sprintf("first-%d", i)
		require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+name+" (topic, payload) VALUES ('a', $1) RETURNING id",
			[]byte(body)).Scan(&last))
		dbtest.Eventually(t, 30*time.Second, body+" sent", func() bool { return delivered(prod, body) })
	}
	dbtest.Eventually(t, time.Minute, "the floors to pass the rows sent", func() bool {
		_, err := pool.Exec(ctx, "INSERT INTO "+name+" (topic, payload) VALUES ('tick', '\\x00')")
		require.NoError(t, err)
		return lowest() >= last
	})
	return tbl, name, prod, s, last, lowest
}

// parkedChecking runs a sweeper woken by host on a table of its own, its
// floors checked every every, and waits for its empty outbox to park with
// the check paused.
func parkedChecking(t *testing.T, every time.Duration) (outbox.Table, *pgxpool.Pool, *memory.Producer, wakingHost, *outbox.Sweeper) {
	t.Helper()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	prod := memory.New(memory.Config{})
	host := wakingHost{wake: make(chan struct{}, 1)}
	s := newSweeper(t, pool, prod, outbox.Config{Table: tbl, Tick: 5 * time.Millisecond, Host: host})
	outbox.SetCursorReset(s, every)
	dbtest.RunSweeper(t, s)
	dbtest.Eventually(t, 30*time.Second, "the empty outbox parked, its floors' check paused", func() bool {
		return s.Parked() && outbox.FloorCheckPaused(s)
	})
	return tbl, pool, prod, host, s
}

// A hosted outbox that parks stops its floors' check's timer (a thousand
// parked tenants' tickers were half of an idle fleet's process CPU), and a sweep
// that finds rows again starts it: the checks go on while the outbox holds a
// row it cannot send.
func TestTheFloorCheckStartsAgainWhenAParkedOutboxFindsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl, pool, prod, host, s := parkedChecking(t, 20*time.Millisecond)

	// Its row's topic refused, the outbox holds a row from here on, and its
	// sweeps never park it again.
	prod.FailTopic("stuck", fmt.Errorf("refused by the test"))
	_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+" (topic, payload) VALUES ('stuck', 'x')")
	require.NoError(t, err)
	before := outbox.FloorChecks(s)
	host.poke()
	dbtest.Eventually(t, time.Minute, "three checks of the floors once the outbox holds a row", func() bool {
		return outbox.FloorChecks(s) >= before+3
	})
	require.False(t, s.Parked(), "an outbox holding a row it could not send parked")
	require.False(t, outbox.FloorCheckPaused(s), "the floors' check paused while the outbox holds a row")
}

// An outbox awake for less than the check's minute at a time still has its
// floors checked: the check's timer, stopped at each park, resumes where it
// stopped when the outbox wakes, rather than start its minute again, which
// would never run out. Here the minute is 2 s, and each wake lasts the
// sweeps that send a row and find none after it (the check's timer ran
// about a fifth of a second a wake on the 2026-11-29 machine; ticks of 5
// ms).
func TestTheFloorCheckResumesItsMinuteAcrossShortWakes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl, pool, prod, host, s := parkedChecking(t, 2*time.Second)
	parked := func() bool { return s.Parked() && outbox.FloorCheckPaused(s) }

	before := outbox.FloorChecks(s)
	deadline := time.Now().Add(2 * time.Minute)
	wakes := 0
	for outbox.FloorChecks(s) == before {
		require.True(t, time.Now().Before(deadline), "no check of the floors in %d wakes of the outbox", wakes)
		wakes++
		_, err := pool.Exec(ctx, "INSERT INTO "+ident(tbl)+" (topic, payload) VALUES ('orders', 'x')")
		require.NoError(t, err)
		host.poke()
		dbtest.Eventually(t, 30*time.Second, "the row sent and the outbox parked again", func() bool {
			return len(prod.Messages()) == wakes && parked()
		})
	}
	t.Logf("the floors checked after %d wakes", wakes)
}

// The check of the floors reads each topic with outstanding rows once, by a
// seek to its lowest one, however deep its backlog: a tripped topic's rows
// stay below the discovery floor once the listing has passed them, and the
// check's first form walked every one of them, filtered out, to look for
// rows of other topics there (a tripped topic of 3,000,000 rows made it a
// 1.2 s statement once a minute, per outbox: issue 33's benchmark). Its
// answers are checked too: a row of a known topic at or below the topic's
// floor, or of a topic not known at or below the discovery floor, is found,
// and nothing else is.
func TestTheFloorCheckReadsATopicOnceHoweverDeepItsBacklog(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	name := ident(tbl)
	insert := func(sql string, args ...any) int64 {
		t.Helper()
		var last int64
		require.NoError(t, pool.QueryRow(ctx, "WITH i AS ("+sql+" RETURNING id) SELECT max(id) FROM i", args...).Scan(&last))
		return last
	}
	// A tripped topic's backlog, then a few rows of five others.
	insert("INSERT INTO " + name + " (topic, payload) SELECT 'tripped', '\\x00' FROM generate_series(1, 30000)")
	last := insert("INSERT INTO " + name + " (topic, payload) SELECT 'topic-' || (g % 5), '\\x00' FROM generate_series(1, 25) g")
	_, err := pool.Exec(ctx, "ANALYZE "+name)
	require.NoError(t, err)

	topics := []string{"tripped", "topic-0", "topic-1", "topic-2", "topic-3", "topic-4"}
	floors := make([]int64, len(topics)) // each below its topic's rows
	check := outboxsql.Statement("below_floors", outboxsql.Tables{Outbox: name})
	below := func(topics []string, floors []int64, discovery int64) bool {
		t.Helper()
		var b bool
		require.NoError(t, pool.QueryRow(ctx, check, topics, floors, discovery).Scan(&b))
		return b
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		p := explain(t, pool, mode, check, topics, floors, last)
		p.noneOf(t, "Seq Scan", "Sort", "Bitmap Heap Scan")
		// A seek is three or four blocks; the walk of the 30,000 rows was
		// over 500.
		t.Logf("%s: %d blocks", mode, p.buffers)
		require.Less(t, p.buffers, 100, "the check read more than a seek per topic (%s):\n%s", mode, p.text)
	}
	require.False(t, below(topics, floors, last), "every row lies above its topic's floor")

	// A known topic's row at its floor.
	var first int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT min(id) FROM "+name+" WHERE topic = 'topic-3'").Scan(&first))
	floors[4] = first
	require.True(t, below(topics, floors, last), "a row of topic-3 at its floor")
	floors[4] = first - 1
	require.False(t, below(topics, floors, last))
	require.True(t, below(append(topics, "topic-3"), append(floors, first), last),
		"a topic named twice, its row at the higher of its floors")

	// A topic not known: found at or below the discovery floor only.
	late := insert("INSERT INTO " + name + " (topic, payload) VALUES ('late', '\\x00')")
	require.False(t, below(topics, floors, late-1), "a row of a topic not known, above the discovery floor")
	require.True(t, below(topics, floors, late), "a row of a topic not known, at the discovery floor")
	require.True(t, below(nil, nil, late), "no topic known: every row at or below the discovery floor counts")
	require.True(t, below(append(topics, "late"), append(floors, late), 0), "a known topic's floor, not the discovery floor, holds for it")
	require.False(t, below(append(topics, "late"), append(floors, late-1), late), "every row above its topic's floor")

	// Rows sent are not outstanding, wherever they lie.
	_, err = pool.Exec(ctx, "UPDATE "+name+" SET dispatched_at = now() WHERE topic = 'late'")
	require.NoError(t, err)
	require.False(t, below(topics, floors, late), "a dispatched row counted")
}

// A sweeper that starts (or whose cursor was reset) behind a tripped topic's
// backlog deeper than a listing's discovery reads finds the other topics at
// once, by a skip scan, rather than one discovery's limit of rows a listing
// later: behind 3,000,000 tripped rows, thirty listings. Here discovery reads
// 10 rows a listing, 300 tripped rows come first, and the next tick is an
// hour away.
func TestAStartBehindATrippedBacklogFindsTheOtherTopicsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	_, err := pool.Exec(ctx, "INSERT INTO "+ident(tbl)+" (topic, payload) SELECT 'stuck', 'x' FROM generate_series(1, 300)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+ident(tbl)+" (topic, payload) VALUES ('orders', 'behind the backlog')")
	require.NoError(t, err)

	prod := memory.New(memory.Config{})
	s := newSweeper(t, pool, prod, outbox.Config{Table: tbl, Tick: time.Hour})
	outbox.SetDiscoveryLimit(s, 10)
	s.TopicBreaker().Trip("stuck", "tripped before the start")
	dbtest.RunSweeper(t, s)
	dbtest.Eventually(t, 30*time.Second, "the row behind the tripped backlog sent", func() bool { return len(prod.Messages()) == 1 })
	require.Equal(t, "orders", prod.Messages()[0].Topic)
}

// A row written with an id of 0 or less, which no sweep reads (the floors
// start at 0), is moved to the dead-letter table by the check of the floors,
// reason invalid_id, and the floors are kept: it once made every sweep read
// every topic from its first row, once a minute, and was never sent. A replay
// sends it, under an id of its own.
func TestARowWithANonPositiveIDIsDeadLetteredNotLeftForever(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	tbl, name, prod, s, last, lowest := checkedEvery20ms(t, 5)

	_, err := pool.Exec(ctx, "INSERT INTO "+name+" (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES (-5, 'neg', 'minus-five'), (0, 'a', 'zero')")
	require.NoError(t, err)
	d, err := outbox.NewDeadLetters(pool, tbl)
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "the two rows dead-lettered", func() bool {
		dead, err := d.List(ctx, outbox.DeadLetterFilter{Reason: outbox.ReasonInvalidID}, 10, false)
		require.NoError(t, err)
		return len(dead) == 2
	})
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 2)
	for _, x := range dead {
		require.Contains(t, x.Error, "is not positive")
	}
	before := outbox.FloorChecks(s)
	dbtest.Eventually(t, time.Minute, "three more checks of the floors", func() bool { return outbox.FloorChecks(s) >= before+3 })
	require.GreaterOrEqual(t, lowest(), last, "the floors were kept")

	n, err := d.Replay(ctx, outbox.DeadLetterFilter{Reason: outbox.ReasonInvalidID})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	dbtest.Eventually(t, time.Minute, "the replayed rows sent", func() bool {
		return delivered(prod, "minus-five") && delivered(prod, "zero")
	})
}

// A row with an id of 0 or less that cannot be moved aside (the dead-letter
// table holds its id already: a copy put back by hand) stays where it is,
// nothing lost, and the check says what failed and what to do.
func TestARowWithANonPositiveIDThatCannotBeMovedStays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	pool := dbtest.Pool(t)
	var logs syncbuf.Buffer
	s := newSweeper(t, pool, memory.New(memory.Config{}), outbox.Config{Table: tbl, Tick: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	outbox.SetCursorReset(s, 20*time.Millisecond)
	_, err := pool.Exec(ctx, "INSERT INTO "+tbl.DeadLetterIdent()+" (id, message_id, topic, payload, created_at, reason) "+
		"VALUES (-5, gen_random_uuid(), 'neg', '\\x00', now(), 'invalid_id')")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+
		" (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES (-5, 'neg', 'again')")
	require.NoError(t, err)
	dbtest.RunSweeper(t, s)
	dbtest.Eventually(t, time.Minute, "the failed move logged", func() bool {
		return strings.Contains(logs.String(), "moving the rows whose id is not positive to the dead-letter table failed")
	})
	require.Contains(t, logs.String(), "UPDATE … SET id = DEFAULT WHERE id <= 0")
	require.Equal(t, 1, dbtest.Outstanding(t, tbl), "the row stays in the outbox")
	require.Len(t, readDeadLetters(t, tbl), 1, "the dead letter holding its id too")
}

// The rows the floors' check moves aside are told to the host (AsideHost),
// which no sweep's result carries: a relay of many probed only the outboxes
// whose sweeps moved rows, and these dead letters went untold.
func TestRowsMovedAsideAreTold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	_, err := dbtest.Pool(t).Exec(ctx, "INSERT INTO "+tbl.Ident()+" (id, topic, payload) OVERRIDING SYSTEM VALUE VALUES (-5, 'neg', 'x'), (0, 'a', 'y')")
	require.NoError(t, err)
	s := newSweeper(t, dbtest.Pool(t), memory.New(memory.Config{}), outbox.Config{Table: tbl})
	told := 0
	require.True(t, outbox.MoveNonPositiveAside(ctx, s, func(n int) { told += n }))
	require.Equal(t, 2, told)
	require.Len(t, readDeadLetters(t, tbl), 2)
}
