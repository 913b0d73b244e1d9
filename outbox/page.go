package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-sweeper/sweeper/producer"
)

// page is a page of claimed rows and the transaction that claimed them. It
// alone runs statements in that transaction, and this file and
// page_outcome.go hold every one of them. A row's life in a page:
//
//	claimPage    BEGIN, claim_page.sql: the rows are read and locked (FOR
//	             UPDATE SKIP LOCKED, by ctid; under OrderingTopic each
//	             topic's advisory lock is taken first). Nothing is written.
//	claimAhead   the next page, in the same transaction, while this one
//	             sends: its locks join the held ones.
//	batch        a send's rows; dispatched notes the broker took them, in
//	             memory only.
//	apply, expire (page_outcome.go)
//	             a failure's outcome, in the transaction: attempts and
//	             last_error (record_failure.sql), or a move to the
//	             dead-letter table (dead_letter.sql). The locks stay.
//	end          move_dispatched.sql and COMMIT, in one round trip: the rows
//	             sent leave the outbox for its history, and that is where
//	             dispatched_at is set (clock_timestamp(), at the page's
//	             end, not at the claim nor at the send). The commit
//	             releases every lock; rows not sent stay outstanding.
//	release      ROLLBACK: every row outstanding as it was, every lock
//	             released. A crash does the same.
//
// Why a transaction that holds row locks across the network calls, rather than
// a claim column with a lease: the lock is the claim. A second sweeper's claim
// skips locked rows (SKIP LOCKED), so it never sends a row this one has in
// flight; if this process dies mid-send, Postgres ends the session and rolls
// the transaction back at once, so no lease has to run out before another
// sweeper may take the rows; and the claim writes no row version at all. The
// claim reads and locks the page in one statement, sent with the BEGIN; the
// move of the sent rows travels with the COMMIT (move_dispatched.sql), and is a
// sent row's only write: one DELETE from the outbox, one INSERT into history
// (issue 32: the mark it replaces was an UPDATE that was never HOT).
//
// During a drain the transaction carries several pages (pagesPerTransaction):
// the next is claimed in it while the current one sends (claimAhead), so the
// database and the broker work at once, and it commits after the last. Topic
// locks are the transaction's, so a second transaction could not claim ahead
// of the same topics under OrderingTopic. A page claimed ahead never reads a
// row the transaction already holds: each topic is read after the last id its
// previous page read.
//
// A drain's sweep runs two such transactions at once, its lanes (sweep.go,
// pageLanes), each over topics of its own: one connection doing every
// claim, move and commit one after another was the drain's bound (busy 87 %
// of a 1.4 s drain of 100,000 rows, while the machine sat 40 % idle), and
// a topic that is one lane's only keeps its lock in that lane's
// transaction, as before; two lanes drained 1.28 times faster. Each lane's
// pages live as described here.
//
// Why one transaction for the page rather than one per batch: with many topics
// a page holds a few rows of each, and a transaction per batch cost the
// database more than the rows did (claim_page.sql has the figures). The
// batches' outcomes stay independent: a batch's failure is recorded in the
// transaction as it comes and touches only its own rows, and a row is moved
// only if its own send succeeded. The price: a database error while recording
// (or a failed commit) rolls the whole page back, so rows other batches sent
// are sent again (at-least-once), and a page's moves become visible only when
// its last batch is done.
//
// The sends of a page run concurrently; conn serializes the statements made
// on the transaction's one connection (failures', the keep-alive's, the claim
// of the next page), and mu guards the rest. Where both are taken, conn comes
// first: a send's bookkeeping takes mu alone, so it never waits for the next
// page's claim.
type page struct {
	s    *store
	conn sync.Mutex
	mu   sync.Mutex
	tx   *pageTx
	// err is the first database error in the transaction: the page then rolls
	// back, whatever else happens.
	err error
	// held finds each claimed row in rows. Both are written by hold while no
	// send is in flight; held is read by batch, and what rows holds of a
	// row changes under mu.
	held map[int64]int
	rows []heldRow
	// left, when set, is told of each row the page's end leaves outstanding
	// (the sweep's cursor keeps the topic's floor below it).
	left func(topic string, id int64)
	// resent, when set, is told how many sent rows of each topic a page
	// that rolls back leaves to be sent again.
	resent func(topic string, n int)
	// last is when the last statement on tx ended; keepAlive reads it.
	// sending holds when each send in flight began, under mu.
	last    time.Time
	sending map[*pageBatch]time.Time
	stop    chan struct{}
	wg      sync.WaitGroup

	// unreadable holds why each claimed row that cannot be sent cannot
	// (readRow), under mu; expire dead-letters them.
	unreadable map[int64]string
}

// heldRow is what a page knows of a row it claimed.
type heldRow struct {
	id    int64
	topic string
	// attempts is the row's attempts as claimed, counted on as failures
	// charge them.
	attempts int
	// tid is where the row's latest version is: where the claim locked it,
	// or where the page's record of a failure put it. The page's end moves a
	// sent row from there (move_dispatched.sql).
	tid pgtype.TID
	// sent says the broker accepted the row.
	sent bool
}

// pageTopic is what a page's claim found of one topic.
type pageTopic struct {
	// candidates counts the outstanding rows read, claimed or not; last is the
	// highest id among them, where the topic's next page starts, and first
	// the lowest.
	candidates  int
	last, first int64
}

// pageStatements is the SQL a page runs in its transaction, one file each in
// sql/.
type pageStatements struct {
	claim, moveSent, recordFailure, deadLetter, recentDeadLetters string
}

func newPageStatements(t Table) pageStatements {
	return pageStatements{
		claim:             statement(t, "claim_page"),
		moveSent:          statement(t, "move_dispatched"),
		recordFailure:     statement(t, "record_failure"),
		deadLetter:        statement(t, "dead_letter"),
		recentDeadLetters: statement(t, "recent_dead_letters"),
	}
}

func stmtCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
}

// claimPage reads and claims up to share outstanding rows of each of topics
// of s's table, each after the id its entry in after names (0: from its
// first), in a transaction of its own. It returns the page (nil if no row was
// claimed: nothing is left open), the claimed rows in id order, and what it
// found of each topic that had outstanding rows.
func claimPage(ctx context.Context, s *store, topics []string, after []int64, share int) (*page, []producer.Message, map[string]pageTopic, error) {
	claimCtx, cancel := stmtCtx(ctx)
	defer cancel()
	defer s.beat()
	r := s.pageRead(topics, share)
	tx, err := beginWith(claimCtx, s.pool, r.scan, s.pageSQL.claim, r.args(after)...)
	if err != nil {
		return nil, nil, nil, r.failed(err)
	}
	if len(r.msgs) == 0 {
		rollback(ctx, tx)
		return nil, nil, r.found, nil
	}
	p := newPage(s, tx)
	p.hold(r.sorted(), r.tids)
	p.unreadable = r.unreadable
	return p, r.msgs, r.found, nil
}

// claimAhead claims the next page in p's transaction, as claimPage does, while
// p's sends go on: the database reads and locks the next page while the
// broker takes this one. It takes conn for its statement, as failures do; the
// rows are p's only once hold takes them, which the caller does when no send
// is in flight (claim reads held without mu). A database error is p's: the
// page then rolls back.
func (p *page) claimAhead(ctx context.Context, topics []string, after []int64, share int) ([]producer.Message, []pgtype.TID, map[string]pageTopic, error) {
	claimCtx, cancel := stmtCtx(ctx)
	defer cancel()
	defer p.s.beat()
	r := p.s.pageRead(topics, share)
	p.conn.Lock()
	defer p.conn.Unlock()
	p.mu.Lock()
	err := p.err
	p.mu.Unlock()
	if err != nil {
		return nil, nil, nil, err
	}
	rows, err := p.tx.Query(claimCtx, p.s.pageSQL.claim, r.args(after)...)
	if err == nil {
		err = r.scan(rows)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.used()
	if err != nil {
		p.err = r.failed(err)
		return nil, nil, nil, p.err
	}
	for id, why := range r.unreadable {
		if p.unreadable == nil {
			p.unreadable = map[int64]string{}
		}
		p.unreadable[id] = why
	}
	return r.sorted(), r.tids, r.found, nil
}

// newPage starts the page of transaction tx, and the keep-alive that stops it
// from idling past its timeout while the page sends.
func newPage(s *store, tx *pageTx) *page {
	p := &page{s: s, tx: tx, held: map[int64]int{}, last: time.Now(), sending: map[*pageBatch]time.Time{}, stop: make(chan struct{})}
	p.wg.Go(p.keepAlive)
	return p
}

// row returns what the page holds of claimed row id. The pointer is good
// until the next hold.
func (p *page) row(id int64) *heldRow { return &p.rows[p.held[id]] }

// hold adds claimed rows msgs to the page. Call it while no send is in flight.
func (p *page) hold(msgs []producer.Message, tids []pgtype.TID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, m := range msgs {
		p.held[m.ID] = len(p.rows)
		p.rows = append(p.rows, heldRow{id: m.ID, topic: m.Topic, attempts: m.Attempts, tid: tids[i]})
	}
}

// keepAliveEvery is how long a page's transaction may sit idle before the
// keep-alive runs a statement on it. The transaction's idle timeout (the send
// timeout plus idleMargin) bounds how long a frozen sweeper holds its rows; a
// page sends many batches one after another, each within the send timeout, so
// without this a page longer than the timeout would lose its session midway.
//
// It keeps the transaction alive only while the page moves: once a send has
// been in flight for longer than the send timeout allows (a producer stuck in
// a call that ignores its context, a write to a pipe nobody reads), it stops
// for good, and Postgres ends the session after the idle timeout, as it does
// for a frozen process, so that another instance sends the rows.
const keepAliveEvery = time.Second

func (p *page) keepAlive() {
	t := time.NewTicker(keepAliveEvery)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		p.conn.Lock()
		p.mu.Lock()
		for _, since := range p.sending {
			if time.Since(since) > p.s.sendTimeout+keepAliveEvery {
				p.mu.Unlock()
				p.conn.Unlock()
				return // wedged
			}
		}
		if p.err == nil && time.Since(p.last) >= keepAliveEvery {
			ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
			if _, err := p.tx.Exec(ctx, "SELECT 1"); err != nil {
				p.err = fmt.Errorf("keep the page's transaction open: %w", err)
			}
			cancel()
			p.last = time.Now()
		}
		p.mu.Unlock()
		p.conn.Unlock()
	}
}

// used notes that a statement has just ended on the transaction. Call with mu
// held.
func (p *page) used() { p.last = time.Now() }

// record takes the page's transaction for statements that record something in
// it (conn, then mu, as everywhere), and returns what gives it back, noting
// the statements' end for the keep-alive. An earlier database error is the
// page's: it comes back instead, and nothing is taken.
func (p *page) record() (release func(), err error) {
	p.conn.Lock()
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		p.conn.Unlock()
		return nil, p.err
	}
	return func() {
		p.used()
		p.s.beat()
		p.mu.Unlock()
		p.conn.Unlock()
	}, nil
}

// end ends the page: it moves the rows sent to the history table, which sets
// their dispatched_at (move_dispatched.sql), and commits, in one round trip,
// releasing every lock; or rolls everything back after a database error, which
// it returns. Rows not sent stay outstanding as they are (with what their
// failures recorded). ctx's cancellation does not stop it.
func (p *page) end(ctx context.Context) error {
	if p.err != nil {
		p.release(ctx)
		p.lostSent()
		return p.err
	}
	p.stopKeepAlive()
	endCtx, cancel := stmtCtx(ctx)
	defer cancel()
	defer p.s.beat()
	var tids []pgtype.TID // the sent rows'
	for _, r := range p.rows {
		if r.sent {
			tids = append(tids, r.tid)
		} else if p.left != nil {
			p.left(r.topic, r.id)
		}
	}
	move := ""
	if len(tids) > 0 {
		move = p.s.pageSQL.moveSent
	}
	if err := p.tx.commit(endCtx, move, tids); err != nil {
		p.lostSent()
		return fmt.Errorf("move a page's %d sent rows of %s to its history (they will be sent again): %w", len(tids), p.s.table, p.s.explain(err))
	}
	return nil
}

// lostSent tells resent of the rows the broker took that a rolled-back page
// leaves outstanding.
func (p *page) lostSent() {
	if p.resent == nil {
		return
	}
	byTopic := map[string]int{}
	p.mu.Lock()
	for _, r := range p.rows {
		if r.sent {
			byTopic[r.topic]++
		}
	}
	p.mu.Unlock()
	for topic, n := range byTopic {
		p.resent(topic, n)
	}
}

// release rolls the page back: every row is outstanding as it was.
func (p *page) release(ctx context.Context) {
	p.stopKeepAlive()
	rollback(ctx, p.tx)
}

func (p *page) stopKeepAlive() {
	close(p.stop)
	p.wg.Wait()
}

// pageBatch is one batch's rows as its page holds them: what the page sends
// and records the outcome of, batch by batch.
type pageBatch struct {
	p *page
	// batch holds the claimed rows, in id order.
	batch producer.Batch
}

// batch returns the rows of b that the page holds. contended says some were
// not held.
func (p *page) batch(b producer.Batch) (c *pageBatch, contended bool) {
	held := make([]int64, 0, len(b.Messages))
	for _, m := range b.Messages {
		if _, ok := p.held[m.ID]; ok {
			held = append(held, m.ID)
		}
	}
	if len(held) == 0 {
		return nil, true
	}
	if len(held) < len(b.Messages) {
		return &pageBatch{p: p, batch: subset(b, held)}, true
	}
	return &pageBatch{p: p, batch: b}, false
}

// attemptsOf returns the attempts of claimed row id.
func (c *pageBatch) attemptsOf(id int64) int {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	return c.p.row(id).attempts
}

// sending notes that c's send begins, for the keep-alive; it returns the
// function that notes its end.
func (c *pageBatch) sending() (done func()) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.p.sending[c] = time.Now()
	return func() {
		c.p.mu.Lock()
		defer c.p.mu.Unlock()
		delete(c.p.sending, c)
	}
}

// dispatched records that the broker accepted every row: the page's end
// moves them to the history table. Nothing is written yet.
func (c *pageBatch) dispatched() {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	for _, m := range c.batch.Messages {
		c.p.row(m.ID).sent = true
	}
}

func rollback(ctx context.Context, tx *pageTx) {
	rollbackCtx, cancel := stmtCtx(ctx)
	defer cancel()
	tx.rollback(rollbackCtx) // a no-op after Commit
}
