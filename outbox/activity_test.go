package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestActivityCountsTheLastMinuteOnly(t *testing.T) {
	var a activity
	t0 := time.Unix(1_700_000_000, 0)
	a.add("orders", t0, activityCounts{dispatched: 10})
	a.add("orders", t0.Add(300*time.Millisecond), activityCounts{dispatched: 5, failed: 1, deadLettered: 2})
	a.add("audit", t0.Add(30*time.Second), activityCounts{failed: 1})

	require.Equal(t, []TopicActivity{
		{Topic: "audit", FailedBatches: 1},
		{Topic: "orders", Dispatched: 15, FailedBatches: 1, DeadLettered: 2},
	}, a.list(t0.Add(59*time.Second)))

	// A minute after orders' second, only audit's failure is left.
	require.Equal(t, []TopicActivity{{Topic: "audit", FailedBatches: 1}}, a.list(t0.Add(time.Minute)))

	// A bucket's second comes round again a minute later: it starts from zero,
	// not from what it counted then.
	a.add("orders", t0.Add(time.Minute), activityCounts{dispatched: 1})
	require.Equal(t, []TopicActivity{
		{Topic: "audit", FailedBatches: 1},
		{Topic: "orders", Dispatched: 1},
	}, a.list(t0.Add(time.Minute)))

	require.Empty(t, a.list(t0.Add(10*time.Minute)))
}

// A second of a flood of topics counts a bounded number of them, and does
// not keep its map's memory once the second comes round again.
func TestActivityDropsAFloodsMap(t *testing.T) {
	var a activity
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 10_000 {
		a.add(string(rune('a'+i%26))+time.Duration(i).String(), t0, activityCounts{dispatched: 1})
	}
	require.Len(t, a.list(t0), activityMaxTopics, "a second counts its first topics only")
	a.add("orders", t0.Add(time.Minute), activityCounts{dispatched: 1})
	require.Len(t, a.buckets[t0.Unix()%int64(activityBuckets)].topics, 1)
	require.Equal(t, []TopicActivity{{Topic: "orders", Dispatched: 1}}, a.list(t0.Add(time.Minute)))
}
