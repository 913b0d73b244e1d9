package outbox

import (
	"context"

	"github.com/outbox-sweeper/sweeper/producer"
)

// maxLoggedTopics bounds the topics named on one log line.
const maxLoggedTopics = 5

// maxNotedTopics bounds the topics whose rows a sweep notes as refused before
// paging (note_refused_topics.sql): in a flood, a statement of bounded cost a
// sweep, and the rest noted at their next trials.
const maxNotedTopics = 1000

// leaveOutUnreachable returns live without the topics the producer says no
// message can reach (producer.TopicChecker: NATS, for a subject no stream
// captures), and trips each of those at once as topic class, without
// claiming a row of it: its rows stay outstanding, and the oldest row of each
// keeps the error as its last_error (no attempt), as when a topic refuses a
// batch.
//
// Why before paging: a topic is otherwise learnt wrong only by claiming its
// rows and sending them, a page slot and a few statements each. Rows that each
// carry a topic of their own (an application writing an id as the topic) then
// fill page after page with topics tried once each, and a healthy topic,
// which gets one share of a page like any of them, waits for all of them: 45
// to 50 s at 100,000 topics (issue 30). Asked first, each costs about a
// microsecond and a breaker trip, and the pages carry the topics that work.
func (s *Sweeper) leaveOutUnreachable(ctx context.Context, pass *gatePass, live []string) ([]string, error) {
	c, ok := s.producer.(producer.TopicChecker)
	if !ok || len(live) == 0 {
		return live, nil
	}
	kept := make([]string, 0, len(live))
	var (
		refused      []string
		first        error
		noted, notes []string
	)
	for _, topic := range live {
		err := c.CheckTopic(ctx, topic)
		if err == nil || producer.ClassOf(err) != producer.ClassTopic {
			kept = append(kept, topic)
			continue
		}
		text := dbText(err.Error())
		s.breaker.Failure(topic, pass.gen(topic), true, text)
		if len(noted) < maxNotedTopics {
			noted, notes = append(noted, topic), append(notes, text)
		}
		s.report(outcome{topic: topic, failure: err})
		if first == nil {
			first = err
		}
		if len(refused) < maxLoggedTopics {
			refused = append(refused, logText(topic))
		}
	}
	if first != nil {
		// One line a sweep, however many: a flood would otherwise log one a topic
		// (the breaker's own line for each trip is the log's price already).
		s.logger.Warn("topics refused before paging: no message can reach them; they trip, their rows wait",
			"num_topics", len(live)-len(kept), "topics", refused, "reason", producer.ReasonOf(first), "err", first)
	}
	if len(noted) > 0 {
		// The note is for the operator: its failure (a lock timeout, say)
		// loses no row and must not stop the topics that work.
		_, err := s.store.pool.Exec(ctx, statement(s.cfg.Table, "note_refused_topics"), noted, notes)
		s.store.beat()
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			s.logger.Warn("noting why refused topics wait failed; they wait all the same, their rows' last_error unchanged",
				"table", s.cfg.Table.String(), "num_topics", len(noted), "err", err)
		}
	}
	return kept, nil
}
