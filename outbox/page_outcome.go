package outbox

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-sweeper/sweeper/producer"
)

// recording takes the page's transaction for recording an outcome (record),
// and runs f in it, with a statement context detached from shutdown: f's
// statements are recordFailure, deadLetter and stormy. An error f returns is
// the page's: its transaction is rolled back at its end, and every row of the
// page is outstanding again. So is an earlier one, and then f does not run.
func (p *page) recording(ctx context.Context, f func(ctx context.Context) error) error {
	ctx, cancel := stmtCtx(ctx)
	defer cancel()
	release, err := p.record()
	if err != nil {
		return err
	}
	defer release()
	if err := f(ctx); err != nil {
		p.err = err
		return err
	}
	return nil
}

// recordFailure records a failed send of ids, rows of topic
// (record_failure.sql): the rows of charged count an attempt and keep
// errText as their last_error; with note every row of ids keeps it, without
// an attempt. The rows stay locked and outstanding: a row of ids may still be
// sent in this page, and moves with what was recorded here. Call it within
// recording.
func (p *page) recordFailure(ctx context.Context, topic string, ids, charged []int64, errText string, note bool) error {
	// The update makes a new version of each row: the page's end finds a
	// row that is sent after all where this one is.
	var (
		id  int64
		tid pgtype.TID
	)
	rows, _ := p.tx.Query(ctx, p.s.pageSQL.recordFailure, ids, charged, dbText(errText), note)
	if _, err := pgx.ForEachRow(rows, []any{&id, &tid}, func() error {
		p.row(id).tid = tid
		return nil
	}); err != nil {
		return fmt.Errorf("record failed send of %d rows of topic %q: %w", len(ids), topic, err)
	}
	for _, id := range charged {
		p.row(id).attempts++
	}
	return nil
}

// ReasonMaxRetriesExceeded is the dead-letter reason of a row that failed
// --max-attempts times.
const ReasonMaxRetriesExceeded = "max_retries_exceeded"

// stormy reports whether dead-lettering n more rows of topic would pass the
// storm guard's limit within its window. Call it within recording.
func (p *page) stormy(ctx context.Context, topic string, n int) (bool, error) {
	s := p.s
	if s.policy.stormLimit <= 0 {
		return false, nil
	}
	var recent int
	if err := p.tx.QueryRow(ctx, s.pageSQL.recentDeadLetters, topic, s.policy.stormWindow).Scan(&recent); err != nil {
		return false, fmt.Errorf("count recent dead letters of topic %q: %w", topic, err)
	}
	return recent+n > s.policy.stormLimit, nil
}

// deadLetter moves the rows of ids with at least minAttempts attempts to the
// dead-letter table (dead_letter.sql), in the page's transaction, noting in
// out what moved. topic names them in errors ("" for rows of several topics).
// Call it within recording, or record.
func (p *page) deadLetter(ctx context.Context, topic string, ids []int64, minAttempts int, reason, errText string, out *outcome) error {
	what := fmt.Sprintf("%d rows of topic %q", len(ids), topic)
	if topic == "" {
		what = fmt.Sprintf("%d rows (%s)", len(ids), reason)
	}
	rows, err := p.tx.Query(ctx, p.s.pageSQL.deadLetter, ids, minAttempts, dbText(reason), dbText(errText))
	if err != nil {
		return fmt.Errorf("dead-letter %s: %w", what, err)
	}
	correlationIDs, err := pgx.CollectRows(rows, pgx.RowTo[*string])
	if err != nil {
		return fmt.Errorf("dead-letter %s: %w", what, err)
	}
	if len(correlationIDs) == 0 {
		return nil
	}
	if out.deadReasons == nil {
		out.deadReasons = map[string]int{}
	}
	out.deadLettered += len(correlationIDs)
	out.deadReasons[reason] += len(correlationIDs)
	for _, c := range correlationIDs {
		if c != nil && len(out.deadCorrelationIDs) < maxLoggedIDs {
			out.deadCorrelationIDs = append(out.deadCorrelationIDs, logText(*c))
		}
	}
	return nil
}

// maxErrorText bounds last_error, so a broker that returns a page of HTML cannot

// expire moves the rows of msgs that can never be sent to the dead-letter
// table, in the page's transaction: those the claim could not read (reason
// unreadable_row, see readRow), and those expiredWhy says passed their
// deadline (reason expired). It returns each moved row's reason, and why
// each unreadable one could not be read; both nil, allocation-free, on the
// usual path: nothing moves. The rows are the page's, locked by its
// transaction: every one named moves. A database error is the page's.
func (p *page) expire(ctx context.Context, msgs []producer.Message, expiredWhy func(*producer.Message) string) (gone, unreadable map[int64]string, err error) {
	type move struct{ reason, why string }
	var byWhy map[move][]int64
	p.mu.Lock()
	for i := range msgs {
		why, reason := p.unreadable[msgs[i].ID], ReasonUnreadableRow
		if why == "" {
			why, reason = expiredWhy(&msgs[i]), ReasonExpired
		}
		if why != "" {
			if byWhy == nil {
				byWhy, gone = map[move][]int64{}, map[int64]string{}
			}
			byWhy[move{reason, why}] = append(byWhy[move{reason, why}], msgs[i].ID)
			gone[msgs[i].ID] = reason
		}
	}
	p.mu.Unlock()
	if byWhy == nil {
		return nil, nil, nil
	}
	ctx, cancel := stmtCtx(ctx)
	defer cancel()
	release, err := p.record()
	if err != nil {
		return nil, nil, err
	}
	defer release()
	// One statement per distinct error text, whatever the topics: with one
	// --max-age that is one statement (two with rows past their own
	// expires_at) for the whole page; an unreadable row has one of its own.
	var out outcome
	moves := slices.SortedFunc(maps.Keys(byWhy), func(a, b move) int {
		return cmp.Or(strings.Compare(a.reason, b.reason), strings.Compare(a.why, b.why))
	})
	for _, mv := range moves {
		if err := p.deadLetter(ctx, "", byWhy[mv], 0, mv.reason, mv.why, &out); err != nil {
			p.err = err
			return nil, nil, err
		}
	}
	for id, reason := range gone {
		if reason == ReasonUnreadableRow {
			if unreadable == nil {
				unreadable = map[int64]string{}
			}
			unreadable[id] = p.unreadable[id]
			delete(p.unreadable, id) // under the record lock (mu): moved, never looked at again
		}
	}
	return gone, unreadable, nil
}
