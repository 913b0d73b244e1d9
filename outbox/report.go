package outbox

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/producer"
)

// maxLoggedIDs bounds the correlation ids on one log line.
const maxLoggedIDs = 10

// observeFailure tells the observer about a failed batch and its dead letters.
func (s *Sweeper) observeFailure(topic string, err error, out applied) {
	s.activity.add(topic, time.Now(), activityCounts{failed: 1, deadLettered: out.deadLettered})
	if s.cfg.Observer == nil {
		return
	}
	s.cfg.Observer.BatchFailed(topic, producer.ClassOf(err))
	if out.deadLettered > 0 {
		s.cfg.Observer.DeadLettered(topic, out.deadLettered)
	}
}

// logDeadLettered logs rows moved to the dead-letter table: topic, reasons and
// the rows' correlation ids as the move returned them, never a payload.
func (s *Sweeper) logDeadLettered(topic string, out applied) {
	reasons := slices.Sorted(maps.Keys(out.deadReasons))
	s.logger.Warn("rows dead-lettered", "topic", logText(topic), "num_rows", out.deadLettered, "reasons", reasons,
		"correlation_ids", out.deadCorrelationIDs, "table", s.cfg.Table.DeadLetterName())
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
		_ = s.cfg.Alerter.Alert(ctx, alert.Alert{Time: time.Now().UTC(), Severity: alert.Critical, Component: "dead-letter-storm-guard",
			Key: "dead-letter-storm/" + topic, Status: alert.Firing, Summary: summary})
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
