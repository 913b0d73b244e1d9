package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/outbox/writer"
)

// DeadLetter is a row of the dead-letter table. Payload and Headers are empty
// unless asked for: they may hold personal data. CreatedAt is cut to the years
// 0 to 9999 (an 'infinity' shows as 9999-12-31T23:59:59Z, a '-infinity' as
// 0000-01-01T00:00:00Z), and Headers left out when Go cannot read them as JSON
// (nested deeper than 10,000 levels; the row's error says so): the table keeps
// what the row held, and a listing never fails on it.
type DeadLetter struct {
	ID             int64           `json:"id"`
	MessageID      string          `json:"message_id"`
	Topic          string          `json:"topic"`
	Payload        []byte          `json:"payload,omitempty"`
	Headers        json.RawMessage `json:"headers,omitempty"`
	ContentType    *string         `json:"content_type"`
	CorrelationID  *string         `json:"correlation_id"`
	PartitionKey   *string         `json:"partition_key"`
	CreatedAt      time.Time       `json:"created_at"`
	Attempts       int             `json:"attempts"`
	LastError      *string         `json:"last_error"`
	Reason         string          `json:"reason"`
	Error          *string         `json:"error"`
	DeadLetteredAt time.Time       `json:"dead_lettered_at"`
}

// listedTime returns t as a dead letter's CreatedAt shows it: within the
// years 0 to 9999, which RFC 3339 (and JSON's encoding of a time.Time) can
// write. A dead letter may hold any timestamp Postgres accepts (an infinite
// or far created_at is why some rows are dead letters, reason
// unreadable_row): listing it must not fail; the table keeps the value.
func listedTime(t pgtype.Timestamptz) time.Time {
	switch {
	case t.InfinityModifier == pgtype.Infinity || (t.Valid && t.Time.Year() > 9999):
		return lastListedTime
	case t.InfinityModifier == pgtype.NegativeInfinity || (t.Valid && t.Time.Year() < 0):
		return firstListedTime
	}
	return t.Time
}

var (
	firstListedTime = time.Date(0, time.January, 1, 0, 0, 0, 0, time.UTC)
	lastListedTime  = time.Date(9999, time.December, 31, 23, 59, 59, 0, time.UTC)
)

// DeadLetterFilter selects dead letters. Zero fields select everything; at
// least one must be set for Replay and Purge, unless All is.
type DeadLetterFilter struct {
	// IDs are dead-letter ids (the rows' outbox ids).
	IDs []int64
	// Topic and Reason match exactly.
	Topic, Reason string
	// Since keeps rows dead-lettered at or after it; Before those before it.
	Since, Before time.Time
	// All selects every dead letter, for Replay and Purge.
	All bool
}

// CheckAge is the rule for a duration that selects dead letters by age (the
// CLI's --since and --older-than, the admin API's since and older_than), so
// that both refuse the same values. Zero is refused rather than read: "older
// than 0s" would purge every dead letter, and "since 0s" would select none;
// whoever means every dead letter says so with All. name is the flag or field,
// for the message.
func CheckAge(name string, d time.Duration) error {
	switch {
	case d < 0:
		return fmt.Errorf("%s is %s: a duration that selects by age must be positive, such as 720h", name, d)
	case d == 0:
		return fmt.Errorf("%s is 0s, which would select every dead letter or none: give a positive duration such as 720h, "+
			"or select every dead letter explicitly (--all, or \"all\": true)", name)
	}
	return nil
}

func (f DeadLetterFilter) empty() bool {
	return len(f.IDs) == 0 && f.Topic == "" && f.Reason == "" && f.Since.IsZero() && f.Before.IsZero()
}

// args returns the filter as the statements' $1–$5; nil leaves a filter off.
func (f DeadLetterFilter) args() []any {
	opt := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	optTime := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t
	}
	var ids any
	if len(f.IDs) > 0 {
		ids = f.IDs
	}
	return []any{ids, opt(f.Topic), opt(f.Reason), optTime(f.Since), optTime(f.Before)}
}

// DeadLetters is the operator's view of an outbox's dead-letter table: list,
// replay and purge. The sweeper binary's `dlq` commands use it, and so will the
// admin API.
type DeadLetters struct {
	pool   *pgxpool.Pool
	table  Table
	list   string
	replay string
	purge  string
}

// NewDeadLetters returns the dead letters of table t.
func NewDeadLetters(pool *pgxpool.Pool, t Table) (*DeadLetters, error) {
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return &DeadLetters{pool: pool, table: t, list: statement(t, "dead_letters_list"),
		replay: statement(t, "dead_letters_replay"), purge: statement(t, "dead_letters_purge")}, nil
}

// List returns up to limit dead letters matching f, newest first, with payloads
// and headers only when withPayload is set.
func (d *DeadLetters) List(ctx context.Context, f DeadLetterFilter, limit int, withPayload bool) ([]DeadLetter, error) {
	list, _, err := d.ListPage(ctx, f, nil, limit, withPayload)
	return list, err
}

// DeadLetterCursor is where a page of dead letters ends: the next page lists
// those that come after it, newest first, however many were dead-lettered
// meanwhile.
type DeadLetterCursor struct {
	At time.Time
	ID int64
}

// ListPage is List from after (nil: from the newest), and returns the cursor
// of the next page, nil when this one was the last.
func (d *DeadLetters) ListPage(ctx context.Context, f DeadLetterFilter, after *DeadLetterCursor, limit int, withPayload bool) ([]DeadLetter, *DeadLetterCursor, error) {
	var at, id any
	if after != nil {
		at, id = after.At, after.ID
	}
	args := append(f.args(), limit, withPayload, at, id)
	rows, err := d.pool.Query(ctx, d.list, args...)
	if err != nil {
		return nil, nil, fmt.Errorf("list dead letters of %s: %w", d.table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetter, error) {
		var x DeadLetter
		var headers []byte
		var createdAt pgtype.Timestamptz
		err := r.Scan(&x.ID, &x.MessageID, &x.Topic, &x.Payload, &headers, &x.ContentType, &x.CorrelationID,
			&x.PartitionKey, &createdAt, &x.Attempts, &x.LastError, &x.Reason, &x.Error, &x.DeadLetteredAt)
		if len(headers) > 0 && json.Valid(headers) {
			x.Headers = headers
		}
		x.CreatedAt = listedTime(createdAt)
		return x, err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list dead letters of %s: %w", d.table, err)
	}
	var next *DeadLetterCursor
	if len(out) == limit && limit > 0 {
		last := out[len(out)-1]
		next = &DeadLetterCursor{At: last.DeadLetteredAt, ID: last.ID}
	}
	return out, next, nil
}

// ErrNoFilter is returned by Replay and Purge given neither a filter nor All:
// an operator who meant everything must say so.
var ErrNoFilter = errors.New("no dead letters selected: give ids or a filter, or select all explicitly")

// Replay moves the dead letters matching f back to the outbox, in one
// transaction, and returns how many. Each returns with attempts 0 and its
// original message_id, as a new row after those outstanding. When f names ids
// and some are not dead letters, nothing is replayed and the error lists them.
//
// The outbox holds each message_id once, and a dead letter's id may be taken
// meanwhile: the application wrote it again, or another dead letter with it was
// replayed. Then nothing is replayed either, and the error is a
// [*ReplayConflictError] naming the id and what holds it; every dead letter
// stays where it was.
func (d *DeadLetters) Replay(ctx context.Context, f DeadLetterFilter) (int, error) {
	if f.empty() && !f.All {
		return 0, ErrNoFilter
	}
	var replayed []int64
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, d.replay, f.args()...)
		if err != nil {
			return err
		}
		if replayed, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return err
		}
		if missing := missingIDs(f.IDs, replayed); len(missing) > 0 {
			// Tell the ids that are not dead letters from those the other
			// filters left out: the runbook's `--reason expired --id 43` of a
			// dead letter 43 of another reason once read "no dead letters
			// with ids [43]", while 43 was there (an independent review).
			e := &MissingDeadLettersError{Table: d.table.Schema + "." + d.table.DeadLetterName()}
			if f.Topic != "" || f.Reason != "" || !f.Since.IsZero() || !f.Before.IsZero() {
				rows, err := tx.Query(ctx, "SELECT id FROM "+d.table.DeadLetterIdent()+" WHERE id = ANY($1) ORDER BY id", missing)
				if err != nil {
					return err
				}
				if e.Unmatched, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
					return err
				}
			}
			e.IDs = missingIDs(missing, e.Unmatched)
			return e
		}
		return nil
	})
	if id, ok := writer.DuplicateMessageID(err, d.table); ok {
		err = d.conflict(ctx, id, err)
	}
	if err != nil {
		return 0, fmt.Errorf("replay dead letters of %s: %w", d.table, err)
	}
	return len(replayed), nil
}

// ReplayConflictError is a replay that would have put one message_id into the
// outbox twice, which its unique index refuses: the outbox already holds a row
// with the id of a dead letter selected (written, or replayed, after the dead
// letter was dead-lettered), or two dead letters selected share the id. Nothing
// was replayed. errors.As finds Postgres's unique violation through it.
type ReplayConflictError struct {
	// DeadLetterIDs are the dead letters holding MessageID; empty when the
	// lookup after the failure found none.
	DeadLetterIDs []int64
	// Err is Postgres's unique violation.
	Err error
	// MessageID is the id, empty when Postgres did not name it (it names the key
	// only to roles that may read the column).
	MessageID string
	// OutboxID is the outbox row holding MessageID, 0 when none does (two dead
	// letters of the selection share it) or the lookup did not find it.
	OutboxID int64
	// Table is the outbox, schema-qualified.
	Table string
}

func (e *ReplayConflictError) Error() string {
	id := "a dead letter's message id"
	if e.MessageID != "" {
		id = "message id " + e.MessageID
	}
	var what, todo string
	switch {
	case e.OutboxID != 0:
		holder := "a dead letter selected"
		if len(e.DeadLetterIDs) > 0 {
			holder = "dead letter " + idList(e.DeadLetterIDs)
		}
		what = fmt.Sprintf("%s of %s is already in %s, as row %d (written or replayed after it was dead-lettered)",
			id, holder, e.Table, e.OutboxID)
		todo = fmt.Sprintf("purge the dead letter if row %d replaces it, or replay it once row %d has been sent; ",
			e.OutboxID, e.OutboxID)
	case len(e.DeadLetterIDs) > 1:
		what = fmt.Sprintf("dead letters %s share %s", idList(e.DeadLetterIDs), id)
		todo = "replay one of them and purge the others; "
	default:
		what = fmt.Sprintf("%s is already in %s, or two dead letters selected share it", id, e.Table)
	}
	return fmt.Sprintf("%s: nothing was replayed, since the outbox holds each message id once "+
		"(a broker that de-duplicates would drop the second); %sother dead letters selected may conflict too, "+
		"list those the outbox holds with SELECT d.id, d.message_id, o.id AS outbox_id FROM %s_dead_letter d JOIN %s o USING (message_id): %v",
		what, todo, e.Table, e.Table, e.Err)
}

func (e *ReplayConflictError) Unwrap() error { return e.Err }

// conflict looks up what holds the message id a replay collided on. It runs
// after the replay's transaction has failed, so it sees committed rows only; if
// the lookup fails, the error names the id alone.
func (d *DeadLetters) conflict(ctx context.Context, messageID string, err error) error {
	e := &ReplayConflictError{Err: err, MessageID: messageID, Table: d.table.String()}
	if messageID == "" {
		return e
	}
	var outboxID *int64
	// Two lookups by message_id: the outbox's is an index seek; the dead-letter
	// table has no index on it, and this runs only when a replay has failed.
	q := fmt.Sprintf(`SELECT (SELECT array_agg(id ORDER BY id) FROM %s WHERE message_id = $1::uuid),
	                         (SELECT id FROM %s WHERE message_id = $1::uuid)`, d.table.DeadLetterIdent(), d.table.Ident())
	if d.pool.QueryRow(ctx, q, messageID).Scan(&e.DeadLetterIDs, &outboxID) == nil && outboxID != nil {
		e.OutboxID = *outboxID
	}
	return e
}

func idList(ids []int64) string {
	if len(ids) == 1 {
		return strconv.FormatInt(ids[0], 10)
	}
	return fmt.Sprint(ids)
}

// Purge deletes the dead letters matching f for good and returns how many;
// with dryRun it deletes nothing and returns how many it would.
func (d *DeadLetters) Purge(ctx context.Context, f DeadLetterFilter, dryRun bool) (int, error) {
	if f.empty() && !f.All {
		return 0, ErrNoFilter
	}
	var n int
	if err := d.pool.QueryRow(ctx, d.purge, append(f.args(), dryRun)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("purge dead letters of %s: %w", d.table, err)
	}
	return n, nil
}

// Count returns how many dead letters match f: what Replay or Purge with the
// same filter would move, for a confirmation that shows the number before an
// operator commits to it. Ids of f that are not dead letters are not counted
// (Replay would refuse them). Like them, it wants a filter or f.All.
func (d *DeadLetters) Count(ctx context.Context, f DeadLetterFilter) (int, error) {
	if f.empty() && !f.All {
		return 0, ErrNoFilter
	}
	var n int
	if err := d.pool.QueryRow(ctx, d.purge, append(f.args(), true)...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead letters of %s: %w", d.table, err)
	}
	return n, nil
}

// MissingDeadLettersError is a replay of ids that are not all dead letters:
// nothing was replayed.
type MissingDeadLettersError struct {
	// IDs are not dead letters; Unmatched are, but the filter's other
	// conditions (topic, reason, time) leave them out.
	IDs, Unmatched []int64
	Table          string // schema.table
}

func (e *MissingDeadLettersError) Error() string {
	var parts []string
	if len(e.IDs) > 0 {
		parts = append(parts, fmt.Sprintf("no dead letters with ids %v in %s", e.IDs, e.Table))
	}
	if len(e.Unmatched) > 0 {
		parts = append(parts, fmt.Sprintf("the dead letters with ids %v in %s do not match the selection's topic, reason or time", e.Unmatched, e.Table))
	}
	return strings.Join(parts, "; ") + ": nothing replayed (list them with `sweeper dlq list`)"
}

func missingIDs(want, got []int64) []int64 {
	var missing []int64
	for _, id := range want {
		if !slices.Contains(got, id) {
			missing = append(missing, id)
		}
	}
	return missing
}
