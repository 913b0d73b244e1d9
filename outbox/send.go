package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
	"go.opentelemetry.io/otel/trace"
)

// checkTimeoutMax bounds the producer's health check after a failed send.
const checkTimeoutMax = 5 * time.Second

type topicResult struct {
	batches, deadLettered, failedBatches, dispatched, skipped int
	// expired counts, among deadLettered, the rows that passed their
	// deadline while their batch waited its turn.
	expired int
	// attempted counts rows that failed alone and counted an attempt; splits
	// the failed batches split to find them.
	attempted, splits int
	// failed and contended say why the topic stopped, if it did.
	failed, contended bool
}

// sendTopic sends one topic's messages of a page, batch after batch, and stops
// when a batch's outcome says so (policy.go), or at a contended batch, so that
// a later batch never overtakes an earlier one. A half-open topic sends one
// batch: its trial; so does any topic while the broker breaker is half-open.
// Rows that already failed alone are sent alone and once: they are likely to
// fail again, and their neighbours must not wait for their retries.
func (s *Sweeper) sendTopic(st *sweepState, g topicGroup) (topicResult, error) {
	var tr topicResult
	_, err := s.sendGroup(st, g, &tr)
	return tr, err
}

// sendGroup cuts and sends g, adding to tr; it reports whether the topic stops.
func (s *Sweeper) sendGroup(st *sweepState, g topicGroup, tr *topicResult) (stop bool, err error) {
	gen := st.plan.Gen(g.topic)
	batches, err := s.producer.Batches(st.work, g.topic, g.msgs)
	if err != nil {
		if done, dbErr := s.rejectCut(st, g, gen, err, tr); done || dbErr != nil {
			return tr.failed || tr.contended || dbErr != nil, dbErr
		}
	}
	for _, b := range isolateSuspects(batches) {
		if st.stop.Err() != nil {
			return true, nil
		}
		suspect := len(b.Messages) == 1 && b.Messages[0].Attempts > 0
		if stop, err := s.sendBatch(st, b, gen, !suspect, tr); err != nil || stop {
			return stop || err != nil, err
		}
		// A half-open topic sends one batch, its trial: the first whose outcome
		// says something of the topic (a batch of poison rows only does not).
		// A half-open broker breaker gets one batch, whatever it says.
		if (st.plan.Trials[g.topic] && tr.dispatched > 0) || st.trial {
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

// sendBatch claims, sends and records one batch, and acts on a failure as the
// policy says: it sends the rest of the batch at once after rows the broker
// refused, and the halves of a batch that failed while the broker was up. It
// reports whether the topic stops for this sweep (setting tr.failed or
// tr.contended). retry says whether the send gets in-call retries.
func (s *Sweeper) sendBatch(st *sweepState, b producer.Batch, gen uint64, retry bool, tr *topicResult) (stop bool, err error) {
	for len(b.Messages) > 0 {
		c, contended := st.page.batch(b)
		if contended {
			claimed := 0
			if c != nil {
				claimed = len(c.batch.Messages)
			}
			tr.skipped += len(b.Messages) - claimed
			if c == nil {
				// Under OrderingNone another sweeper has the rows: go on with
				// the next batch. Under OrderingTopic the topic stops here, so
				// that no later batch overtakes this one.
				tr.contended = s.cfg.Ordering == OrderingTopic
				return tr.contended, nil
			}
		}
		// A row that passed its deadline while the batch waited its turn
		// (for a slot of --concurrency, behind the topic's earlier batches)
		// is not sent either.
		kept, moved, err := s.expireRows(st, c.batch.Messages)
		if err != nil {
			tr.failed = true
			return true, err
		}
		tr.expired += moved.expired
		tr.deadLettered += moved.total()
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
				tr.failed = true
				return true, nil
			}
		}
		sent := c.sending()
		sendErr := s.send(st.work, b, retry)
		sent()
		tr.batches++
		if sendErr == nil {
			c.dispatched()
			done(breaker.BrokerUp, nil)
			st.up.Store(true)
			s.succeeded(b, gen, tr)
			return false, nil
		}

		named := intersect(b.IDs(), producer.MessageIDs(sendErr))
		f := failure{
			class:       producer.ClassOf(sendErr),
			rows:        len(b.Messages),
			named:       len(named),
			attempts:    c.attemptsOf(b.Messages[0].ID),
			maxAttempts: s.store.policy.maxAttempts,
			broker:      st.evidence(),
			ordered:     s.cfg.Ordering == OrderingTopic,
		}
		a := decide(f)
		if a.check {
			f.broker = s.checkBroker(st)
			a = decide(f)
		}
		done(a.broker, sendErr)
		out, err := c.apply(st.work, a, sendErr)
		if err != nil {
			tr.failed = true
			return true, err
		}
		a = out.a
		tr.failedBatches++
		tr.deadLettered += out.deadLettered
		if out.attempted {
			tr.attempted++
		}
		s.observeFailure(b.Topic, sendErr, out)
		s.logFailure(b, sendErr, a, f.broker)
		if out.deadLettered > 0 {
			s.logDeadLettered(b.Topic, out)
		}
		if out.storm {
			s.stopStorm(b.Topic, max(len(named), 1), sendErr)
			tr.failed = true
			return true, nil
		}
		if a.tripTopic {
			s.breaker.Failure(b.Topic, gen, true, truncate(sendErr.Error(), maxErrorText))
		}
		if a.backoff {
			s.backoff.failed(b.Topic, time.Now())
		}
		switch {
		case a.split:
			tr.splits++
			return s.split(st, b, gen, sendErr, tr)
		case a.resendRest:
			b = without(b, named)
			continue
		case a.stopTopic:
			tr.failed = true
			return true, nil
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
func (s *Sweeper) split(st *sweepState, b producer.Batch, gen uint64, cause error, tr *topicResult) (bool, error) {
	half := len(b.Messages) / 2
	dispatched, attempted := tr.dispatched, tr.attempted
	for _, h := range []producer.Batch{{Topic: b.Topic, Messages: b.Messages[:half]}, {Topic: b.Topic, Messages: b.Messages[half:]}} {
		if st.work.Err() != nil {
			return true, nil
		}
		if stop, err := s.sendBatch(st, h, gen, false, tr); err != nil || stop {
			return true, err
		}
	}
	if blameTopicAfterSplit(len(b.Messages), tr.dispatched-dispatched, tr.attempted-attempted) {
		s.breaker.Failure(b.Topic, gen, false, truncate(fmt.Sprintf(
			"every row of a batch of %d failed alone while the broker was up: %v", len(b.Messages), cause), maxErrorText))
		tr.failed = true
		return true, nil
	}
	return false, nil
}

// send sends b within --send-timeout, with the in-call retries if retry is set.
func (s *Sweeper) send(ctx context.Context, b producer.Batch, retry bool) (err error) {
	if s.cfg.Tracer != nil {
		var span trace.Span
		ctx, span = s.startSendSpan(ctx, b)
		defer func() { endSendSpan(span, err) }()
	}
	sendCtx, cancel := context.WithTimeout(ctx, s.cfg.SendTimeout)
	defer cancel()
	defer s.store.beat()
	obs, _ := s.cfg.Observer.(SendObserver)
	try := func(ctx context.Context) error {
		if obs == nil {
			return s.producer.Send(ctx, b)
		}
		start := time.Now()
		err := s.producer.Send(ctx, b)
		obs.BatchSent(b.Topic, len(b.Messages), time.Since(start), err)
		return err
	}
	if retry {
		r := s.cfg.Retry
		if obs != nil {
			r.OnRetry = func(err error) { obs.SendRetried(b.Topic, producer.ClassOf(err)) }
		}
		err = r.Do(sendCtx, try)
	} else {
		err = try(sendCtx)
	}
	if err != nil && sendCtx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
		err = fmt.Errorf("send of %d messages timed out after %s (--send-timeout): %w", len(b.Messages), s.cfg.SendTimeout, err)
	}
	return err
}

// succeeded records a batch the broker accepted.
func (s *Sweeper) succeeded(b producer.Batch, gen uint64, tr *topicResult) {
	s.breaker.Success(b.Topic, gen)
	s.backoff.succeeded(b.Topic)
	tr.dispatched += len(b.Messages)
	now := time.Now()
	s.activity.add(b.Topic, now, activityCounts{dispatched: len(b.Messages)})
	if s.cfg.Observer != nil {
		lat := make([]time.Duration, len(b.Messages))
		for i := range b.Messages {
			lat[i] = now.Sub(b.Messages[i].CreatedAt)
		}
		s.cfg.Observer.BatchDispatched(b.Topic, len(b.Messages), lat)
	}
	if s.logger.Enabled(context.Background(), slog.LevelDebug) {
		s.logger.Debug("batch dispatched", "topic", b.Topic, "num_rows", len(b.Messages),
			"first_id", b.Messages[0].ID, "last_id", b.Messages[len(b.Messages)-1].ID,
			"correlation_ids", correlationIDs(b, maxLoggedIDs))
	}
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
		st.down.Store(true)
		return brokerDown
	}
	ctx, cancel := context.WithTimeout(st.work, min(s.cfg.SendTimeout, checkTimeoutMax))
	defer cancel()
	if err := c.Check(ctx); err != nil {
		s.logger.Debug("broker health check failed: the failure is the broker's", "err", err)
		st.down.Store(true)
		return brokerDown
	}
	st.up.Store(true)
	return brokerUp
}

// rejectCut acts on the producer's failure to cut g into batches (err from
// Batches), as the policy says: rows it named leave for the dead-letter table
// at once and the batches it did cut go on; a refusal that names no row is cut
// again in halves; otherwise the topic stops for this sweep (tr.failed). It
// reports whether g is done with, so that the batches are not sent.
func (s *Sweeper) rejectCut(st *sweepState, g topicGroup, gen uint64, err error, tr *topicResult) (done bool, dbErr error) {
	all := producer.Batch{Topic: g.topic, Messages: g.msgs}
	named := subset(all, slices.Sorted(slices.Values(intersect(all.IDs(), producer.MessageIDs(err)))))
	a := decide(failure{class: producer.ClassOf(err), rows: len(g.msgs), named: len(named.Messages), cut: true})
	if a.deadLetterNamed && len(named.Messages) == 0 {
		named = all // a refusal of one row that names none
	}
	tr.failedBatches++
	if a.broker != breaker.VerdictUnknown && s.broker != nil {
		if done, refused := s.broker.Allow(); refused == nil {
			done(a.broker, err)
		}
	}
	if a.deadLetterNamed {
		c, contended := st.page.batch(named)
		if c == nil {
			// Another sweeper has them: under OrderingTopic the topic waits
			// for it; under OrderingNone the rest goes on.
			tr.skipped += len(named.Messages)
			tr.contended = s.cfg.Ordering == OrderingTopic
			return tr.contended, nil
		}
		if contended {
			tr.skipped += len(named.Messages) - len(c.batch.Messages)
		}
		out, dbErr := c.apply(st.work, a, err)
		if dbErr != nil {
			return true, dbErr
		}
		tr.deadLettered += out.deadLettered
		s.observeFailure(g.topic, err, out)
		s.logFailure(c.batch, err, out.a, brokerUnknown)
		if out.deadLettered > 0 {
			s.logDeadLettered(g.topic, out)
		}
		if out.storm {
			s.stopStorm(g.topic, len(named.Messages), err)
			tr.failed = true
			return true, nil
		}
		return false, nil // the rest of the topic goes on
	}
	s.observeFailure(g.topic, err, applied{})
	s.logFailure(all, err, a, brokerUnknown)
	if a.note {
		// The rows keep the reason as their last_error, so that an operator
		// looking at them sees why they wait. Rows another sweeper holds are
		// left as they are.
		if c, _ := st.page.batch(all); c != nil {
			if _, dbErr := c.apply(st.work, a, err); dbErr != nil {
				return true, dbErr
			}
		}
	}
	if a.split {
		// Cut the halves on their own, in id order, until the rows the
		// producer refuses stand alone.
		tr.splits++
		half := len(g.msgs) / 2
		for _, h := range []topicGroup{{g.topic, g.msgs[:half]}, {g.topic, g.msgs[half:]}} {
			if stop, dbErr := s.sendGroup(st, h, tr); stop || dbErr != nil {
				return true, dbErr
			}
		}
		return true, nil // the halves sent what could be sent
	}
	if a.tripTopic {
		s.breaker.Failure(g.topic, gen, true, truncate(err.Error(), maxErrorText))
	}
	if a.backoff {
		s.backoff.failed(g.topic, time.Now())
	}
	tr.failed = true
	return true, nil
}
