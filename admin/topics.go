package admin

import (
	"cmp"
	"slices"
	"strings"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// StatusTopicsDefault is how many topics GET /status lists when
// Config.StatusTopics is zero.
const StatusTopicsDefault = 200

// capTopics keeps the n topics an operator most needs to see, by name, and
// returns how many it left out. Rows that each carry a topic of their own
// (an application writing an id as the topic) made /status list every one:
// 20 MB at 100,000 topics, and a console that froze re-rendering them. What
// comes first: a breaker not closed, a backoff, failures or dead letters in
// the last minute, then the most outstanding rows, then the most dispatched.
func capTopics(topics []*topicStatus, n int) ([]*topicStatus, int) {
	if len(topics) <= n {
		return topics, 0
	}
	ranked := slices.Clone(topics)
	slices.SortFunc(ranked, func(x, y *topicStatus) int {
		return cmp.Or(
			-cmp.Compare(trouble(x), trouble(y)),
			-cmp.Compare(x.Outstanding, y.Outstanding),
			-cmp.Compare(x.DispatchedLastMinute, y.DispatchedLastMinute),
			strings.Compare(x.Topic, y.Topic))
	})
	shown := ranked[:n]
	slices.SortFunc(shown, func(x, y *topicStatus) int { return strings.Compare(x.Topic, y.Topic) })
	return shown, len(topics) - n
}

// trouble ranks what is wrong with a topic: higher comes first.
func trouble(t *topicStatus) int {
	switch {
	case t.State != "closed":
		return 3
	case t.BackoffFailures > 0:
		return 2
	case t.FailedBatchesLastMinute > 0 || t.DeadLetteredLastMinute > 0:
		return 1
	}
	return 0
}

// capGroups keeps the n dead-letter groups with the most rows, in their
// order, and returns how many it left out: the groups are by topic, so a
// topic per row makes one per row too.
func capGroups(groups []outbox.DeadLetterGroup, n int) ([]outbox.DeadLetterGroup, int) {
	if len(groups) <= n {
		return groups, 0
	}
	ranked := slices.Clone(groups)
	slices.SortStableFunc(ranked, func(x, y outbox.DeadLetterGroup) int { return -cmp.Compare(x.Count, y.Count) })
	floor := ranked[n-1].Count
	above := 0 // groups above floor are all kept; then groups at floor, first come
	for _, g := range ranked[:n] {
		if g.Count > floor {
			above++
		}
	}
	atFloor := n - above
	out := make([]outbox.DeadLetterGroup, 0, n)
	for _, g := range groups {
		switch {
		case g.Count > floor:
			out = append(out, g)
		case g.Count == floor && atFloor > 0:
			out = append(out, g)
			atFloor--
		}
	}
	return out, len(groups) - n
}
