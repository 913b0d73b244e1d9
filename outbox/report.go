package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/producer"
)

// maxLoggedIDs bounds the correlation ids on one log line.
const maxLoggedIDs = 10

// report tells the observer, the activity counters and the log of o's
// event: a batch dispatched, a batch failed (with its dead letters), rows
// expired or unreadable moved to the dead-letter table. It is the only caller
// of the observer's and the activity's counts of them, so that each is
// counted once, where it happened. The failure itself is logged by execute,
// with what the policy made of it (logFailure).
func (s *Sweeper) report(o outcome) {
	if len(o.sent.Messages) > 0 {
		s.reportDispatched(o.sent)
	}
	if o.failure != nil {
		s.reportFailure(o)
	}
	for _, u := range o.unreadable {
		s.reportUnreadable(u.m, u.why)
	}
	if len(o.expiredRows) > 0 {
		s.reportExpired(o.expiredRows)
	}
}

// resentRolledBack reports n rows of topic the broker took that a rolled
// back page leaves to be sent again.
func (s *Sweeper) resentRolledBack(topic string, n int) { s.resent(topic, ResendRolledBack, n) }

// resent tells the observer of n rows of topic sent again, or left to be,
// after the broker may have taken them.
func (s *Sweeper) resent(topic, cause string, n int) {
	if o, ok := s.cfg.Observer.(ResendObserver); ok && n > 0 {
		o.Resent(topic, cause, n)
	}
}

func (s *Sweeper) reportDispatched(b producer.Batch) {
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

// reportFailure counts and observes a failed batch and its dead letters, and
// logs the dead letters: topic, reasons and the rows' correlation ids as the
// move returned them, never a payload.
func (s *Sweeper) reportFailure(o outcome) {
	s.activity.add(o.topic, time.Now(), activityCounts{failed: 1, deadLettered: o.deadLettered})
	if s.cfg.Observer != nil {
		s.cfg.Observer.BatchFailed(o.topic, producer.ClassOf(o.failure))
		if o.deadLettered > 0 {
			s.cfg.Observer.DeadLettered(o.topic, o.deadLettered)
		}
	}
	if o.deadLettered > 0 {
		reasons := slices.Sorted(maps.Keys(o.deadReasons))
		s.logger.Warn("rows dead-lettered", "topic", logText(o.topic), "num_rows", o.deadLettered, "reasons", reasons,
			"correlation_ids", o.deadCorrelationIDs, "table", s.cfg.Table.DeadLetterName())
	}
}

// reportUnreadable logs, counts and observes an unreadable row moved to the
// dead-letter table. The error names the column and its value cut short,
// never the payload.
func (s *Sweeper) reportUnreadable(m producer.Message, why string) {
	s.activity.add(m.Topic, time.Now(), activityCounts{deadLettered: 1})
	s.logger.Warn("row unreadable: a column holds a value the sweeper cannot send; it was dead-lettered, the rest of the page goes on",
		"topic", logText(m.Topic), "id", m.ID, "correlation_id", logText(m.CorrelationID), "reason", ReasonUnreadableRow,
		"err", why, "table", s.cfg.Table.DeadLetterName())
	if s.cfg.Observer != nil {
		s.cfg.Observer.DeadLettered(m.Topic, 1)
	}
}

// reportExpired logs, counts and observes the rows that expired, topic by
// topic.
func (s *Sweeper) reportExpired(moved expiredTally) {
	for _, topic := range slices.Sorted(maps.Keys(moved)) {
		e := moved[topic]
		s.activity.add(topic, time.Now(), activityCounts{deadLettered: e.n})
		s.logger.Warn("rows expired: past their deadline, they were dead-lettered instead of sent",
			"topic", logText(topic), "num_rows", e.n, "reason", ReasonExpired,
			"correlation_ids", e.correlationIDs, "table", s.cfg.Table.DeadLetterName())
		if s.cfg.Observer != nil {
			s.cfg.Observer.DeadLettered(topic, e.n)
			if o, ok := s.cfg.Observer.(ExpiryObserver); ok {
				o.Expired(topic, e.n)
			}
		}
	}
}

// stopStorm trips a topic whose messages are being rejected faster than the
// storm guard allows, and alerts: a broker error misread as the messages' fault
// must not empty the outbox into the dead-letter table.
func (s *Sweeper) stopStorm(topic string, n int, err error) {
	summary := fmt.Sprintf("dead-letter storm on topic %q: %d more rows rejected (%s) with more than %d dead-lettered within %s; "+
		"dead-lettering stopped and the topic tripped. Check the producer's error, fix it, then reset the topic",
		topic, n, cmp.Or(producer.ReasonOf(err), producer.ClassOf(err).String()), s.cfg.DeadLetterLimit, s.cfg.DeadLetterWindow)
	s.breaker.Trip(topic, summary)
	s.logger.Error(summary, "topic", logText(topic), "err", err)
	if s.cfg.Alerter != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// A one-off notice, not a condition: nothing resolves a storm, and
		// keyed as one, a second storm of the topic within the repeat
		// interval (after a reset) was only counted, unposted, while the
		// trip that came with it alerts at warning, as an operator's
		// (an independent review, 2026-11-29). A storm trips the topic until
		// it is reset, so storms cannot repeat faster than resets.
		_ = s.cfg.Alerter.Alert(ctx, alert.Alert{Time: time.Now().UTC(), Severity: alert.Critical, Component: "dead-letter-storm-guard",
			Summary: summary})
	}
}

// correlationIDs returns up to n non-empty correlation ids of b.
func correlationIDs(b producer.Batch, n int) []string {
	var out []string
	for _, m := range b.Messages {
		if m.CorrelationID != "" {
			out = append(out, logText(m.CorrelationID))
			if len(out) == n {
				break
			}
		}
	}
	return out
}

// maxLogText bounds a topic or a correlation id on a log line: rows carry what
// applications put there, and a 10,000-byte topic must not become a
// 10,000-byte line at every failure.
const maxLogText = 200

// logText returns s cut to maxLogText bytes, at a rune boundary, with its full
// size when cut.
func logText(s string) string {
	if len(s) <= maxLogText {
		return s
	}
	return fmt.Sprintf("%s(%d bytes)", truncate(s, maxLogText), len(s))
}
