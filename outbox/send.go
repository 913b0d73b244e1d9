package outbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
	"go.opentelemetry.io/otel/trace"
)

// checkTimeoutMax bounds the producer's health check after a failed send.
const checkTimeoutMax = 5 * time.Second

// topicSender sends one topic's rows of a page, batch after batch, and acts
// on each failure as the policy decides (decide, then execute). It records
// every outcome in the page it was given, and nowhere else: sending never
// reaches the store.
type topicSender struct {
	s           *Sweeper
	st          *sweepState
	page        *page
	topic       string
	gen         uint64 // the topic breaker's generation when the sweep planned
	maxAttempts int    // --max-attempts; 0 keeps rows forever
	// out is what the topic's sending did.
	out outcome
}

func (s *Sweeper) topicSender(st *sweepState, topic string) *topicSender {
	return &topicSender{s: s, st: st, page: st.page, topic: topic, out: outcome{topic: topic}, gen: st.gate.gen(topic), maxAttempts: max(s.cfg.MaxAttempts, 0)}
}

// send sends one topic's messages of a page, batch after batch, and stops
// when a batch's outcome says so (policy.go), or at a contended batch, so that
// a later batch never overtakes an earlier one. A half-open topic sends one
// batch: its trial; so does any topic while the broker breaker is half-open.
// Rows that already failed alone are sent alone and once: they are likely to
// fail again, and their neighbours must not wait for their retries.
func (t *topicSender) send(g topicGroup) error {
	_, err := t.sendGroup(g)
	return err
}

// sendGroup cuts and sends g; it reports whether the topic stops.
func (t *topicSender) sendGroup(g topicGroup) (stop bool, err error) {
	t.s.deadline(g.msgs)
	// Cutting may ask the broker (Service Bus attaches its link to size a
	// batch): bounded as a send is, so that a namespace that hangs holds
	// the topic no longer than --send-timeout (an independent review).
	cutCtx, cancel := context.WithTimeout(t.st.work, t.s.cfg.SendTimeout)
	batches, err := t.s.producer.Batches(cutCtx, g.topic, g.msgs)
	cancel()
	if err != nil {
		if done, dbErr := t.rejectCut(g, err); done || dbErr != nil {
			return t.out.failed || t.out.contended || dbErr != nil, dbErr
		}
	}
	for _, b := range isolateSuspects(batches) {
		if t.st.stop.Err() != nil {
			return true, nil
		}
		if t.st.gate.tripped(g.topic) {
			t.out.tripped = true
			return true, nil
		}
		suspect := len(b.Messages) == 1 && b.Messages[0].Attempts > 0
		if stop, err := t.sendBatch(b, !suspect); err != nil || stop {
			return stop || err != nil, err
		}
		// A half-open topic sends one batch, its trial: the first whose outcome
		// says something of the topic (a batch of poison rows only does not).
		// A half-open broker breaker gets one batch, whatever it says.
		if (t.st.gate.trial(g.topic) && t.out.dispatched > 0) || t.st.trial {
			return true, nil
		}
	}
	return false, nil
}

// isolateSuspects cuts rows that have failed before (attempts > 0) out of their
// batches into batches of their own, keeping id order.
func isolateSuspects(batches []producer.Batch) []producer.Batch {
	out := make([]producer.Batch, 0, len(batches))
	for _, b := range batches {
		start := 0
		for i, m := range b.Messages {
			if m.Attempts == 0 {
				continue
			}
			if i > start {
				out = append(out, producer.Batch{Topic: b.Topic, Messages: b.Messages[start:i]})
			}
			out = append(out, producer.Batch{Topic: b.Topic, Messages: b.Messages[i : i+1]})
			start = i + 1
		}
		if start < len(b.Messages) {
			out = append(out, producer.Batch{Topic: b.Topic, Messages: b.Messages[start:]})
		}
	}
	return out
}

// sendBatch sends the rows of b that the page holds, and acts on a failure as
// the policy says (execute): it sends the rest of the batch at once after rows
// the broker refused, and the halves of a batch that failed while the broker
// was up. It reports whether the topic stops for this sweep (setting
// tr.failed or tr.contended). retry says whether the send gets in-call
// retries.
func (t *topicSender) sendBatch(b producer.Batch, retry bool) (stop bool, err error) {
	s, st := t.s, t.st
	for len(b.Messages) > 0 {
		c, contended := t.page.batch(b)
		if contended {
			claimed := 0
			if c != nil {
				claimed = len(c.batch.Messages)
			}
			t.out.skipped += len(b.Messages) - claimed
			if c == nil {
				// Under OrderingNone another sweeper has the rows: go on with
				// the next batch. Under OrderingTopic the topic stops here, so
				// that no later batch overtakes this one.
				t.out.contended = s.cfg.Ordering == OrderingTopic
				return t.out.contended, nil
			}
		}
		// A row that passed its deadline while the batch waited its turn
		// (for a slot of --concurrency, behind the topic's earlier batches)
		// is not sent either.
		kept, moved, err := s.expireRows(st, c.batch.Messages)
		if err != nil {
			t.out.failed = true
			return true, err
		}
		t.out.add(moved)
		if len(kept) == 0 {
			return false, nil
		}
		c.batch.Messages = kept
		b = c.batch

		done := func(breaker.Verdict, error) {}
		if s.broker != nil {
			if done, err = s.broker.Allow(); err != nil {
				// Open, or half-open with its trial out: nothing is sent and
				// nothing is learnt; the page's end puts the rows back as they
				// were.
				t.out.failed = true
				return true, nil
			}
		}
		sent := c.sending()
		delivered, sendErr := s.send(st.work, b, retry)
		sent()
		t.out.batches++
		if sendErr == nil {
			c.dispatched()
			done(breaker.BrokerUp, nil)
			st.broker.up.Store(true)
			t.succeeded(b)
			return false, nil
		}
		// The rows the broker took before the failure are sent: the page
		// moves them as it moves a success's, and the failure is the rest's.
		if len(delivered) > 0 {
			d := subset(b, delivered)
			(&pageBatch{p: c.p, batch: d}).dispatched()
			st.broker.up.Store(true)
			t.succeeded(d)
			if b = without(b, delivered); len(b.Messages) == 0 {
				done(breaker.BrokerUp, nil)
				return false, nil
			}
			c = &pageBatch{p: c.p, batch: b}
		}

		// A producer without a check (Service Bus) keeps what the sweep saw:
		// with nothing to ask, every timeout would read as the broker down,
		// and a row that always times out would never count an attempt.
		if _, checks := s.producer.(producer.Checker); checks && len(delivered) == 0 &&
			errors.Is(sendErr, context.DeadlineExceeded) && producer.ClassOf(sendErr) == producer.ClassTransient {
			// No answer within --send-timeout: what the sweep saw of the broker
			// before is no evidence now. A broker that stopped answering during
			// a sweep (a half-open connection the client still thinks up, a
			// RabbitMQ memory alarm) had its timeouts split batch after batch,
			// each half waiting the timeout again, and its rows charged
			// attempts, the broker breaker told only that it was up (an
			// independent review, 2026-11-29). The check below asks it.
			st.broker.forget()
		}
		named := intersect(b.IDs(), producer.MessageIDs(sendErr))
		if mayHaveArrived(sendErr) {
			// Whatever happens to them now, a later send of these rows may
			// be their second.
			s.resent(b.Topic, ResendUnknownOutcome, len(b.Messages)-len(named))
		}
		f := failure{
			class:       producer.ClassOf(sendErr),
			rows:        len(b.Messages),
			delivered:   len(delivered),
			named:       len(named),
			attempts:    c.attemptsOf(b.Messages[0].ID),
			maxAttempts: t.maxAttempts,
			broker:      st.evidence(),
			ordered:     s.cfg.Ordering == OrderingTopic,
		}
		a := decide(f)
		if a.check {
			f.broker = s.checkBroker(st)
			a = decide(f)
		}
		next, err := t.execute(failed{rows: c, batch: b, named: named, f: f, err: sendErr, verdict: done}, a)
		switch next {
		case nextSplit:
			return t.split(b, sendErr)
		case nextRest:
			b = without(b, named)
			continue
		case nextStop:
			return true, err
		}
		return false, nil
	}
	return false, nil
}

// split sends the halves of b, which failed while the broker was up, each
// claimed and judged on its own and split again if it fails, until the failing
// rows stand alone: only they count an attempt (AWS Lambda's
// BisectBatchOnFunctionError). The halves go in id order, once each; under
// OrderingTopic the topic stops at the first half that fails. A batch whose
// every row failed alone blames the topic.
func (t *topicSender) split(b producer.Batch, cause error) (bool, error) {
	half := len(b.Messages) / 2
	dispatched, attempted := t.out.dispatched, t.out.attempted
	for _, h := range []producer.Batch{{Topic: b.Topic, Messages: b.Messages[:half]}, {Topic: b.Topic, Messages: b.Messages[half:]}} {
		if t.st.work.Err() != nil {
			return true, nil
		}
		if stop, err := t.sendBatch(h, false); err != nil || stop {
			return true, err
		}
	}
	if blameTopicAfterSplit(len(b.Messages), t.out.dispatched-dispatched, t.out.attempted-attempted) {
		t.s.breaker.Failure(b.Topic, t.gen, false, truncate(fmt.Sprintf(
			"every row of a batch of %d failed alone while the broker was up: %v", len(b.Messages), cause), maxErrorText))
		t.out.failed = true
		return true, nil
	}
	return false, nil
}

// rejectCut acts on the producer's failure to cut g into batches (err from
// Batches), as the policy says (execute): rows it named leave for the
// dead-letter table at once and the batches it did cut go on; a refusal that
// names no row is cut again in halves; otherwise the topic stops for this
// sweep (tr.failed). It reports whether g is done with, so that the batches
// are not sent.
func (t *topicSender) rejectCut(g topicGroup, err error) (done bool, dbErr error) {
	all := producer.Batch{Topic: g.topic, Messages: g.msgs}
	named := subset(all, slices.Sorted(slices.Values(intersect(all.IDs(), producer.MessageIDs(err)))))
	f := failure{class: producer.ClassOf(err), rows: len(g.msgs), named: len(named.Messages), cut: true}
	a := decide(f)
	if a.deadLetterNamed && len(named.Messages) == 0 {
		named = all // a refusal of one row that names none
	}
	fl := failed{batch: all, named: named.IDs(), f: f, err: err, verdict: t.cutVerdict}
	switch {
	case a.deadLetterNamed:
		c, contended := t.page.batch(named)
		if c == nil {
			// Another sweeper has them: under OrderingTopic the topic waits
			// for it; under OrderingNone the rest goes on.
			t.out.failedBatches++
			t.out.skipped += len(named.Messages)
			t.out.contended = t.s.cfg.Ordering == OrderingTopic
			return t.out.contended, nil
		}
		if contended {
			t.out.skipped += len(named.Messages) - len(c.batch.Messages)
		}
		fl.rows, fl.batch = c, c.batch
	case a.note:
		// The rows keep the reason as their last_error, so that an operator
		// looking at them sees why they wait. Rows another sweeper holds are
		// left as they are.
		fl.rows, _ = t.page.batch(all)
	}
	next, dbErr := t.execute(fl, a)
	switch {
	case dbErr != nil:
		return true, dbErr
	case next == nextSplit:
		// Cut the halves on their own, in id order, until the rows the
		// producer refuses stand alone.
		half := len(g.msgs) / 2
		for _, h := range []topicGroup{{g.topic, g.msgs[:half]}, {g.topic, g.msgs[half:]}} {
			if stop, dbErr := t.sendGroup(h); stop || dbErr != nil {
				return true, dbErr
			}
		}
		return true, nil // the halves sent what could be sent
	case next == nextStop:
		return true, nil
	}
	return false, nil // the rest of the topic goes on
}

// cutVerdict gives the broker breaker what a failed cut says of the broker.
// A cut makes no call of its own, so it takes one of the breaker's only to
// report that.
func (t *topicSender) cutVerdict(v breaker.Verdict, err error) {
	if v == breaker.VerdictUnknown || t.s.broker == nil {
		return
	}
	if done, refused := t.s.broker.Allow(); refused == nil {
		done(v, err)
	}
}

// succeeded records a batch the broker accepted.
func (t *topicSender) succeeded(b producer.Batch) {
	t.s.breaker.Success(b.Topic, t.gen)
	t.s.backoff.succeeded(b.Topic)
	o := outcome{topic: b.Topic, dispatched: len(b.Messages), sent: b}
	t.s.report(o)
	t.out.add(o)
}

// mayHaveArrived reports whether a failed send's rows may have reached the
// broker all the same: a transient failure (a timeout, a nack), a local one
// (a send cancelled in flight), or a connection lost once it was made. A
// refusal (topic or message class) or a failed dial sent nothing.
func mayHaveArrived(err error) bool {
	switch producer.ClassOf(err) {
	case producer.ClassTopic, producer.ClassMessage:
		return false
	case producer.ClassBroker:
		var op *net.OpError
		return !errors.As(err, &op) || op.Op != "dial"
	}
	return true
}

// send sends b within --send-timeout, with the in-call retries if retry is
// set. delivered lists, in id order, the rows the broker took before a
// failure (producer.Delivered): a retry sends only the others, and a
// failure is theirs.
func (s *Sweeper) send(ctx context.Context, b producer.Batch, retry bool) (delivered []int64, err error) {
	if s.cfg.Tracer != nil {
		var span trace.Span
		ctx, span = s.startSendSpan(ctx, b)
		defer func() { endSendSpan(span, err) }()
	}
	sendCtx, cancel := context.WithTimeout(ctx, s.cfg.SendTimeout)
	defer cancel()
	defer s.progress.beat()
	obs, _ := s.cfg.Observer.(SendObserver)
	try := func(ctx context.Context) error {
		var err error
		if obs == nil {
			err = s.producer.Send(ctx, b)
		} else {
			start := time.Now()
			err = s.producer.Send(ctx, b)
			obs.BatchSent(b.Topic, len(b.Messages), time.Since(start), err)
		}
		if err == nil || producer.Delivered(err) == nil {
			return err
		}
		if took := intersect(b.IDs(), producer.Delivered(err)); len(took) > 0 {
			delivered = append(delivered, took...)
			if b = without(b, took); len(b.Messages) == 0 {
				return nil // the broker took every row after all
			}
		}
		return err
	}
	if retry {
		r := s.cfg.Retry
		r.OnRetry = func(err error) {
			if obs != nil {
				obs.SendRetried(b.Topic, producer.ClassOf(err))
			}
			if mayHaveArrived(err) {
				s.resent(b.Topic, ResendUnknownOutcome, len(b.Messages)) // b: the rows the retry sends
			}
		}
		err = r.Do(sendCtx, try)
	} else {
		err = try(sendCtx)
	}
	if err != nil && sendCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
		if !errors.Is(err, context.DeadlineExceeded) {
			// A retry whose last try the deadline cut short says the try
			// before it, which hid the timeout from the sweep's evidence
			// (a broker that stopped answering on the retry read as up,
			// its row charged): the deadline is said too.
			err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
		}
		err = fmt.Errorf("send of %d messages timed out after %s (--send-timeout): %w", len(b.Messages), s.cfg.SendTimeout, err)
	}
	if err == nil {
		delivered = nil // every row arrived
	}
	slices.Sort(delivered)
	return delivered, err
}

// checkBroker asks the producer's health check whether the broker is up, once
// per sweep: the answer is the policy's evidence for the sweep's other
// failures too. A producer without a check gives no evidence, so its failures
// are the broker's unless a send of the sweep succeeded.
func (s *Sweeper) checkBroker(st *sweepState) evidence {
	if e := st.evidence(); e != brokerUnknown {
		return e
	}
	c, ok := s.producer.(producer.Checker)
	if !ok {
		st.broker.down.Store(true)
		return brokerDown
	}
	ctx, cancel := context.WithTimeout(st.work, min(s.cfg.SendTimeout, checkTimeoutMax))
	defer cancel()
	if err := c.Check(ctx); err != nil {
		s.logger.Debug("broker health check failed: the failure is the broker's", "err", err)
		st.broker.down.Store(true)
		return brokerDown
	}
	st.broker.up.Store(true)
	return brokerUp
}
