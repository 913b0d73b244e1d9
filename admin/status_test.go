package admin

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/outbox"
)

// With more topics than the cap, /status keeps those in trouble, then the
// deepest backlogs, then the busiest, by name, and counts the rest.
func TestCapTopicsKeepsTroubleThenBacklogThenTraffic(t *testing.T) {
	t.Parallel()
	var topics []*topicStatus
	for i := range 1000 {
		topics = append(topics, &topicStatus{Topic: fmt.Sprintf("uuid-%04d", i), State: "closed", Outstanding: 1})
	}
	topics = append(topics,
		&topicStatus{Topic: "tripped", State: "tripped"},
		&topicStatus{Topic: "backing-off", State: "closed", BackoffFailures: 2},
		&topicStatus{Topic: "failing", State: "closed", FailedBatchesLastMinute: 1},
		&topicStatus{Topic: "deep", State: "closed", Outstanding: 5000},
		&topicStatus{Topic: "busy", State: "closed", Outstanding: 1, DispatchedLastMinute: 900})
	shown, omitted := capTopics(topics, 6)
	require.Equal(t, len(topics)-6, omitted)
	var names []string
	for _, s := range shown {
		names = append(names, s.Topic)
	}
	require.Equal(t, []string{"backing-off", "busy", "deep", "failing", "tripped", "uuid-0000"}, names)

	all, omitted := capTopics(topics[:3], 6)
	require.Len(t, all, 3)
	require.Zero(t, omitted)
}

func TestCapGroupsKeepsTheLargestInTheirOrder(t *testing.T) {
	t.Parallel()
	groups := []outbox.DeadLetterGroup{{Topic: "a", Count: 1}, {Topic: "b", Count: 9}, {Topic: "c", Count: 1}, {Topic: "d", Count: 5}, {Topic: "e", Count: 1}}
	kept, omitted := capGroups(groups, 3)
	require.Equal(t, 2, omitted)
	require.Equal(t, []outbox.DeadLetterGroup{{Topic: "a", Count: 1}, {Topic: "b", Count: 9}, {Topic: "d", Count: 5}}, kept)
}
