package outbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// hostile writes one row of topic with the given SQL values of expires_at,
// created_at and headers (NULL-free SQL text; "" keeps the default), and
// returns its id.
func hostile(t *testing.T, tbl outbox.Table, topic, createdAt, expiresAt, headers string) int64 {
	t.Helper()
	cols, vals := []string{"topic", "payload"}, []string{"$1", `'\x01'`}
	for _, c := range []struct{ col, val string }{{"created_at", createdAt}, {"expires_at", expiresAt}, {"headers", headers}} {
		if c.val != "" {
			cols, vals = append(cols, c.col), append(vals, c.val)
		}
	}
	var id int64
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), fmt.Sprintf(`INSERT INTO %s (%s) VALUES (%s) RETURNING id`,
		tbl.Ident(), strings.Join(cols, ", "), strings.Join(vals, ", ")), topic).Scan(&id))
	return id
}

// dropFiniteCheck drops migration 8's constraint, as a table migrated before
// it holds rows it would refuse.
func dropFiniteCheck(t *testing.T, tbl outbox.Table) {
	t.Helper()
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT %s_created_at_finite`, tbl.Ident(), tbl.Name))
	require.NoError(t, err)
}

// The wedges: a row whose created_at is infinite, or whose headers
// nest deeper than Go reads, failed the claim of every page, and nothing was
// sent. Now each such row is dead-lettered as unreadable_row, with the column
// and its value in the error; an expires_at of 'infinity' is no deadline and
// its row is sent; '-infinity' has passed. The healthy topic is sent in the
// same sweep, and the status and the dead-letter listing read the rows.
func TestUnreadableRowsAreDeadLetteredAndTheirNeighboursSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tbl := dbtest.Table(t)
	dropFiniteCheck(t, tbl)
	writeMessages(t, tbl, topicMessages("healthy", 3)...)
	forever := hostile(t, tbl, "bad", "", "'infinity'", "")
	past := hostile(t, tbl, "bad", "", "'-infinity'", "")
	future := hostile(t, tbl, "bad", "'infinity'", "", "")
	beginning := hostile(t, tbl, "bad", "'-infinity'", "", "")
	deep := hostile(t, tbl, "bad", "", "", fmt.Sprintf(`'{"a":%s%s}'`, strings.Repeat("[", 11_000), strings.Repeat("]", 11_000)))
	far := hostile(t, tbl, "bad", "'294276-12-31 23:59:59+00'", "'294276-12-31 23:59:59+00'", "")
	writeMessages(t, tbl, topicMessages("healthy", 2)...)

	b, err := outbox.NewBacklog(dbtest.Pool(t), tbl)
	require.NoError(t, err)
	backlog, err := b.Topics(ctx)
	require.NoError(t, err, "the status reads a backlog with infinite created_at")
	require.Len(t, backlog, 2)

	prod := memory.New(memory.Config{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl})
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 5+2, res.Dispatched, "the healthy rows, the row without a deadline and the far one")
	require.Equal(t, 4, res.DeadLettered)
	require.Equal(t, 1, res.Expired)
	require.Zero(t, dbtest.Outstanding(t, tbl))

	sent := map[int64]bool{}
	for _, m := range prod.Messages() {
		sent[m.ID] = true
	}
	require.True(t, sent[forever] && sent[far])

	dead := readDeadLetters(t, tbl)
	require.Equal(t, []int64{past}, deadIDs(dead, outbox.ReasonExpired))
	require.Equal(t, []int64{future, beginning, deep}, deadIDs(dead, outbox.ReasonUnreadableRow))
	for _, d := range dead {
		switch d.ID {
		case future:
			require.Contains(t, d.Error, "created_at is 'infinity'")
		case beginning:
			require.Contains(t, d.Error, "created_at is '-infinity'")
		case deep:
			require.Contains(t, d.Error, "headers cannot be read as JSON")
			require.Less(t, len(d.Error), 400, "the value is cut short")
		}
	}

	dl, err := outbox.NewDeadLetters(dbtest.Pool(t), tbl)
	require.NoError(t, err)
	list, err := dl.List(ctx, outbox.DeadLetterFilter{}, 10, true)
	require.NoError(t, err, "the listing reads infinite created_at and deep headers")
	require.Len(t, list, 4)
	groups, err := b.DeadLetters(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, groups)
}

// Migration 8 refuses a new row whose created_at is infinite.
func TestInfiniteCreatedAtIsRefusedAtWriteTime(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	for _, v := range []string{"infinity", "-infinity"} {
		_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
			`INSERT INTO %s (topic, payload, created_at) VALUES ('t', '\x01', '%s')`, tbl.Ident(), v))
		pgErr, ok := err.(*pgconn.PgError)
		require.True(t, ok, "%v", err)
		require.Equal(t, "23514", pgErr.Code, "check_violation")
		require.Contains(t, pgErr.ConstraintName, "created_at_finite")
	}
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		`INSERT INTO %s (topic, payload, expires_at, created_at) VALUES ('t', '\x01', 'infinity', now() - interval '1 day')`, tbl.Ident()))
	require.NoError(t, err, "an expires_at of infinity is no deadline, and a past created_at is fine")
}
