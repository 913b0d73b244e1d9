package outbox

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// ActivityWindow is how far back [Sweeper.TopicActivity] counts.
const ActivityWindow = time.Minute

// TopicActivity is what this sweeper did for one topic within the last
// ActivityWindow: the console's "dispatched in the last minute" and "failures
// in the window". It counts this process only: other instances on the same
// table keep their own.
type TopicActivity struct {
	Topic string `json:"topic"`
	// Dispatched counts the rows the broker accepted.
	Dispatched int `json:"dispatched"`
	// FailedBatches counts the sends of the topic that failed, of every class
	// (a batch split after a failure counts each failing half).
	FailedBatches int `json:"failed_batches"`
	// DeadLettered counts the rows moved to the dead-letter table.
	DeadLettered int `json:"dead_lettered"`
}

// activity keeps TopicActivity in one-second buckets, a ring of them over the
// window, so that recording costs a map update per batch and reading sums at
// most a minute of buckets: no database range scan for a figure the process
// already knows.
type activity struct {
	mu      sync.Mutex
	buckets [activityBuckets]activityBucket
}

const activityBuckets = int(ActivityWindow / time.Second)

// activityMaxTopics bounds the topics one second counts: the topics past it
// in that second go uncounted. Rows that each carry a topic of their own
// would otherwise keep a minute of them, a map entry each (and a /status
// answer that sums them all); a service's real topics are far fewer, and
// /status lists a few hundred at most anyway. The window holds at most
// ActivityWindow/time.Second times this many entries.
const activityMaxTopics = 512

// activityKeepMap is the most topics a bucket's map may have held and still
// be cleared for reuse rather than replaced.
const activityKeepMap = 64

type activityBucket struct {
	sec    int64 // the Unix second it counts
	topics map[string]activityCounts
}

type activityCounts struct{ dispatched, failed, deadLettered int }

func (a *activity) add(topic string, now time.Time, c activityCounts) {
	sec := now.Unix()
	a.mu.Lock()
	defer a.mu.Unlock()
	b := &a.buckets[sec%int64(activityBuckets)]
	if b.sec != sec {
		b.sec = sec
		if b.topics == nil || len(b.topics) > activityKeepMap {
			// clear keeps a map's buckets: a second of a flood of topics
			// would hold its memory for good.
			b.topics = map[string]activityCounts{}
		}
		clear(b.topics)
	}
	t, ok := b.topics[topic]
	if !ok && len(b.topics) >= activityMaxTopics {
		return // a flood's second: see activityMaxTopics
	}
	t.dispatched += c.dispatched
	t.failed += c.failed
	t.deadLettered += c.deadLettered
	b.topics[topic] = t
}

// list sums the buckets of the window that ends at now, by topic name.
func (a *activity) list(now time.Time) []TopicActivity {
	sec := now.Unix()
	sums := map[string]activityCounts{}
	a.mu.Lock()
	for i := range a.buckets {
		b := &a.buckets[i]
		if b.sec <= sec-int64(activityBuckets) || b.sec > sec {
			continue
		}
		for topic, c := range b.topics {
			s := sums[topic]
			s.dispatched += c.dispatched
			s.failed += c.failed
			s.deadLettered += c.deadLettered
			sums[topic] = s
		}
	}
	a.mu.Unlock()
	out := make([]TopicActivity, 0, len(sums))
	for _, topic := range slices.Sorted(maps.Keys(sums)) {
		c := sums[topic]
		out = append(out, TopicActivity{Topic: topic, Dispatched: c.dispatched, FailedBatches: c.failed, DeadLettered: c.deadLettered})
	}
	return out
}

// TopicActivity lists, by topic name, what this sweeper dispatched, failed and
// dead-lettered within the last ActivityWindow. Topics with nothing in the
// window are left out, and so are the topics past the first 512 of a second.
func (s *Sweeper) TopicActivity() []TopicActivity { return s.activity.list(time.Now()) }
