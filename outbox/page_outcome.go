package outbox

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-sweeper/sweeper/producer"
)

// applied is what the page recorded of a failure.
type applied struct {
	// attempted says the row counted an attempt.
	attempted bool
	// deadLettered counts the rows moved to the dead-letter table, by reason,
	// with their correlation ids (for the log).
	deadLettered       int
	deadReasons        map[string]int
	deadCorrelationIDs []string
	// storm is set when the action's dead letters would have passed the storm
	// guard's limit for the topic: nothing was dead-lettered, and the topic
	// must trip.
	storm bool
	// a is the action as applied: stormed() when storm is set.
	a action
}

// apply records a failed send as the policy's action says, in the page's
// transaction. Rows it neither charges nor dead-letters stay outstanding as
// they were when the page ends (unless sent again in this page). An error is
// the page's: its transaction is rolled back at its end, and every row of the
// page is outstanding again.
func (c *pageBatch) apply(ctx context.Context, a action, sendErr error) (applied, error) {
	out := applied{a: a}
	p, topic := c.p, c.batch.Topic
	recordCtx, cancel := stmtCtx(ctx)
	defer cancel()
	release, err := p.record()
	if err != nil {
		return out, err
	}
	defer release()
	fail := func(err error) (applied, error) {
		p.err = err
		return out, err
	}

	var named []int64
	if a.deadLetterNamed {
		named = intersect(c.batch.IDs(), producer.MessageIDs(sendErr))
		if len(named) == 0 { // a refusal of a row sent alone that names none
			named = c.batch.IDs()
		}
	}
	if a.deadLetters() {
		storm, err := p.stormy(recordCtx, topic, max(len(named), 1))
		if err != nil {
			return fail(err)
		}
		if storm {
			out.storm, a = true, a.stormed()
			out.a = a
		}
	}
	if !a.attempt && !a.deadLetters() && !a.note {
		return out, nil // the page's end releases the rows
	}
	errText := truncate(sendErr.Error(), maxErrorText)
	charged := []int64{}
	if a.attempt {
		charged = c.batch.IDs()
	}
	if _, err := p.tx.Exec(recordCtx, p.s.pageSQL.recordFailure, c.batch.IDs(), charged, errText, a.note); err != nil {
		return fail(fmt.Errorf("record failed send of %d rows of topic %q: %w", len(c.batch.Messages), topic, err))
	}
	for _, id := range charged {
		p.attempts[id]++
	}
	out.attempted = a.attempt
	if a.deadLetterNamed {
		byReason := map[string][]int64{}
		for _, id := range named {
			r := producer.RowReason(sendErr, id)
			byReason[r] = append(byReason[r], id)
		}
		for _, r := range slices.Sorted(maps.Keys(byReason)) {
			if err := p.deadLetter(recordCtx, topic, byReason[r], 0, r, errText, &out); err != nil {
				return fail(err)
			}
		}
	}
	if a.exhausted {
		if err := p.deadLetter(recordCtx, topic, c.batch.IDs(), p.s.policy.maxAttempts, ReasonMaxRetriesExceeded, errText, &out); err != nil {
			return fail(err)
		}
	}
	return out, nil
}

// ReasonMaxRetriesExceeded is the dead-letter reason of a row that failed
// --max-attempts times.
const ReasonMaxRetriesExceeded = "max_retries_exceeded"

// stormy reports whether dead-lettering n more rows of topic would pass the
// storm guard's limit within its window.
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
// Call it within record.
func (p *page) deadLetter(ctx context.Context, topic string, ids []int64, minAttempts int, reason, errText string, out *applied) error {
	what := fmt.Sprintf("%d rows of topic %q", len(ids), topic)
	if topic == "" {
		what = fmt.Sprintf("%d rows (%s)", len(ids), reason)
	}
	rows, err := p.tx.Query(ctx, p.s.pageSQL.deadLetter, ids, minAttempts, reason, errText)
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
	var out applied
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
