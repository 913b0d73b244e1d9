package outbox

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// This file carries out the failure policy's actions (policy.go decides
// them). An action is acted on here and nowhere else: adding one touches
// policy.go and this file.

// failed is a failed send, or a failed cut, as execute acts on it.
type failed struct {
	// rows are the page's rows the outcome is recorded on; nil records
	// nothing.
	rows *pageBatch
	// batch is what failed, for the log; named, the ids of its rows the
	// error names.
	batch producer.Batch
	named []int64
	// f is the failure as decide saw it, and err its error.
	f   failure
	err error
	// verdict gives the broker breaker its verdict.
	verdict func(breaker.Verdict, error)
}

// next is what a topic's sending does after execute.
type next int

const (
	// nextBatch: go on with the next batch.
	nextBatch next = iota
	// nextRest: send the failed batch's rows the error did not name, at once.
	nextRest
	// nextSplit: send the failed batch again as two halves.
	nextSplit
	// nextStop: the topic sends nothing more in this sweep.
	nextStop
)

// execute carries out action a on fl: it gives the broker breaker its
// verdict, records the outcome in the page (record), logs and reports it,
// stops a dead-letter storm, trips or backs off the topic, and returns what
// the topic's sending does next. A database error is the page's, and stops
// the topic.
func (t *topicSender) execute(fl failed, a action) (next, error) {
	s, topic := t.s, t.topic
	o := outcome{topic: topic, failedBatches: 1, failure: fl.err}
	fl.verdict(a.broker, fl.err)
	if fl.rows != nil {
		var err error
		if o, a, err = t.record(fl.rows, a, o); err != nil {
			t.out.add(outcome{failedBatches: 1, failed: true})
			return nextStop, err
		}
	}
	// The topic is tripped or backs off before the failure is logged, so that
	// the log line says what the gate answers for it from now on: the one
	// answer /status and the console show too.
	switch {
	case o.stormed:
		s.stopStorm(topic, max(len(fl.named), 1), fl.err)
	case a.tripTopic:
		s.breaker.Failure(topic, t.gen, true, truncate(fl.err.Error(), maxErrorText))
	}
	if a.backoff && !o.stormed {
		s.backoff.failed(topic, time.Now())
	}
	var held *TopicGate
	if a.stopTopic {
		g := s.gate.stopped(topic, time.Now())
		held = &g
	}
	s.logFailure(fl.batch, fl.err, a, fl.f.broker, held)
	s.report(o)
	t.out.add(o)
	if o.stormed {
		t.out.failed = true
		return nextStop, nil
	}
	switch {
	case a.split:
		t.out.splits++
		return nextSplit, nil
	case a.resendRest:
		return nextRest, nil
	case a.stopTopic:
		t.out.failed = true
		return nextStop, nil
	}
	return nextBatch, nil
}

// record records in the page what action a does to the rows of c, whose
// send failed with o.failure: their attempts and last_error, and their moves
// to the dead-letter table, after the storm guard has had its say (which may
// turn a into a.stormed(), and set o.stormed). It returns o with what it did,
// and the action as carried out. Rows it neither charges nor dead-letters
// stay outstanding as they were when the page ends (unless sent again in this
// page). An error is the page's.
func (t *topicSender) record(c *pageBatch, a action, o outcome) (outcome, action, error) {
	p, topic, cause := c.p, c.batch.Topic, o.failure
	err := p.recording(t.st.work, func(ctx context.Context) error {
		var named []int64
		if a.deadLetterNamed {
			named = intersect(c.batch.IDs(), producer.MessageIDs(cause))
			if len(named) == 0 { // a refusal of a row sent alone that names none
				named = c.batch.IDs()
			}
		}
		if a.deadLetters() {
			storm, err := p.stormy(ctx, topic, max(len(named), 1))
			if err != nil {
				return err
			}
			if storm {
				o.stormed, a = true, a.stormed()
			}
		}
		if !a.attempt && !a.deadLetters() && !a.note {
			return nil // the page's end releases the rows
		}
		errText := cause.Error() // recordFailure and deadLetter make it fit (dbText)
		charged := []int64{}
		if a.attempt {
			charged = c.batch.IDs()
		}
		if err := p.recordFailure(ctx, topic, c.batch.IDs(), charged, errText, a.note); err != nil {
			return err
		}
		if a.attempt {
			o.attempted = 1
		}
		if a.deadLetterNamed {
			byReason := map[string][]int64{}
			for _, id := range named {
				r := producer.RowReason(cause, id)
				byReason[r] = append(byReason[r], id)
			}
			for _, r := range slices.Sorted(maps.Keys(byReason)) {
				if err := p.deadLetter(ctx, topic, byReason[r], 0, r, errText, &o); err != nil {
					return err
				}
			}
		}
		if a.exhausted {
			return p.deadLetter(ctx, topic, c.batch.IDs(), t.maxAttempts, ReasonMaxRetriesExceeded, errText, &o)
		}
		return nil
	})
	return o, a, err
}

// logFailure logs a failed batch with what the policy made of it: topic, class,
// reason, the rows' ids and correlation ids, the broker's part; never a
// payload; and, when the failure stops its topic, the gate's answer for it
// (why, until when), which is what /status shows of it. b is never
// empty: every caller sent or rejected at least one row.
func (s *Sweeper) logFailure(b producer.Batch, err error, a action, ev evidence, held *TopicGate) {
	class := producer.ClassOf(err)
	level, msg := slog.LevelWarn, "batch failed; its topic is held"
	switch {
	case class == producer.ClassLocal:
		level, msg = slog.LevelInfo, "batch cancelled; its rows stay outstanding" // shutting down: nothing is wrong
	case a.deadLetterNamed && a.resendRest:
		msg = "messages rejected; the rest of the topic goes on"
	case a.deadLetterNamed:
		msg = "message rejected"
	case a.tripTopic:
		msg = "the topic refused the batch; the topic trips"
	case a.split:
		level, msg = slog.LevelInfo, "batch failed while the broker is up; sending its halves to find the rows that fail"
	case a.attempt && a.stopTopic:
		msg = "row failed alone while the broker is up: it counts an attempt, and its topic waits (--ordering topic)"
	case a.attempt:
		msg = "row failed alone while the broker is up: it counts an attempt; the rest of the topic goes on"
	case a.broker == breaker.BrokerDown:
		msg = "batch failed and the broker is not known to be up: rows kept without an attempt; its topic is held"
	}
	attrs := []any{"topic", logText(b.Topic), "class", class.String(), "reason", producer.ReasonOf(err), "num_rows", len(b.Messages),
		"first_id", b.Messages[0].ID, "last_id", b.Messages[len(b.Messages)-1].ID, "broker", ev.String(),
		"correlation_ids", correlationIDs(b, maxLoggedIDs), "err", err}
	if held != nil {
		attrs = append(attrs, gateAttr(*held))
	}
	s.logger.Log(context.Background(), level, msg, attrs...)
}

// gateAttr is the gate's answer as a log attribute, shaped as /status shows
// it: gate={reason, until, cooldown_ticks}, the fields that apply. The topic
// and the error are the line's own.
func gateAttr(g TopicGate) slog.Attr {
	attrs := []any{"reason", string(g.Reason)}
	if !g.Until.IsZero() {
		attrs = append(attrs, "until", g.Until.UTC())
	}
	if g.CooldownTicks > 0 {
		attrs = append(attrs, "cooldown_ticks", g.CooldownTicks)
	}
	return slog.Group("gate", attrs...)
}
