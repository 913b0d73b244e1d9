package outbox

import (
	"context"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/producer"
)

// maxLoggedTopics bounds the topics named on one log line.
const maxLoggedTopics = 5

// leaveOutUnreachable returns live without the topics the producer says no
// message can reach (producer.TopicChecker: NATS, for a subject no stream
// captures), and trips each of those at once as topic class, without
// claiming a row of it: its rows stay outstanding as they are.
//
// Why before paging: a topic is otherwise learnt wrong only by claiming its
// rows and sending them, a page slot and a few statements each. Rows that each
// carry a topic of their own (an application writing an id as the topic) then
// fill page after page with topics tried once each, and a healthy topic,
// which gets one share of a page like any of them, waits for all of them: 45
// to 50 s at 100,000 topics (issue 30). Asked first, each costs about a
// microsecond and a breaker trip, and the pages carry the topics that work.
func (s *Sweeper) leaveOutUnreachable(ctx context.Context, plan breaker.Plan, live []string) []string {
	c, ok := s.producer.(producer.TopicChecker)
	if !ok || len(live) == 0 {
		return live
	}
	kept := make([]string, 0, len(live))
	var (
		refused []string
		first   error
	)
	for _, topic := range live {
		err := c.CheckTopic(ctx, topic)
		if err == nil || producer.ClassOf(err) != producer.ClassTopic {
			kept = append(kept, topic)
			continue
		}
		s.breaker.Failure(topic, plan.Gen(topic), true, truncate(err.Error(), maxErrorText))
		s.observeFailure(topic, err, applied{})
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
	return kept
}
