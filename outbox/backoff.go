package outbox

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"
)

// topicBackoff keeps topics whose sends failed transiently out of paging for a
// while: the first wait is initial, each failure in a row doubles it up to
// maxWait, and a success ends it. Each wait is drawn in [d/2, d) so that
// topics that failed together do not all come back on the same sweep.
//
// Why per topic and in time, not in ticks: with wake-ups on commit a failing
// topic would otherwise be tried again at the application's commit pace; the
// topic breaker's cooldowns (in ticks) are for topics that are wrong, this is
// for topics that are merely failing for now.
type topicBackoff struct {
	initial, maxWait time.Duration
	rand             func() float64

	mu     sync.Mutex
	topics map[string]*topicWait
}

type topicWait struct {
	failures int
	until    time.Time
}

// TopicBackoff is a topic waiting after transient failures, for operators.
type TopicBackoff struct {
	Topic string `json:"topic"`
	// Failures counts the failed tries in a row.
	Failures int `json:"failures"`
	// Until is when the topic is tried again.
	Until time.Time `json:"until"`
}

func newTopicBackoff(initial, maxWait time.Duration, rnd func() float64) *topicBackoff {
	if rnd == nil {
		rnd = rand.Float64
	}
	if maxWait >= 0 {
		maxWait = max(maxWait, initial)
	}
	return &topicBackoff{initial: initial, maxWait: maxWait, rand: rnd, topics: map[string]*topicWait{}}
}

// failed starts or lengthens topic's wait, and returns it.
func (b *topicBackoff) failed(topic string, now time.Time) time.Duration {
	if b.maxWait < 0 {
		return 0 // off
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.topics[topic]
	if w == nil {
		w = &topicWait{}
		b.topics[topic] = w
	}
	w.failures++
	d := b.initial
	for i := 1; i < w.failures && d < b.maxWait; i++ {
		d *= 2
	}
	d = min(d, b.maxWait)
	wait := d/2 + time.Duration(b.rand()*float64(d-d/2))
	w.until = now.Add(wait)
	return wait
}

// succeeded ends topic's wait.
func (b *topicBackoff) succeeded(topic string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.topics, topic)
}

// waiting lists the topics whose wait has not ended at now. It forgets the
// topics whose wait ended more than maxWait ago without another try: they had
// nothing more to send (their rows went, or were dead-lettered), and rows that
// each carry a topic of their own would otherwise keep an entry per topic ever
// failed. Such a topic's next failure starts again at the first wait.
func (b *topicBackoff) waiting(now time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for t, w := range b.topics {
		switch {
		case now.Before(w.until):
			out = append(out, t)
		case now.Sub(w.until) > b.maxWait:
			delete(b.topics, t)
		}
	}
	return out
}

// until returns when topic's wait ends, if it failed in a row.
func (b *topicBackoff) until(topic string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.topics[topic]; w != nil {
		return w.until, true
	}
	return time.Time{}, false
}

// list returns every topic with failures in a row, by topic.
func (b *topicBackoff) list() []TopicBackoff {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]TopicBackoff, 0, len(b.topics))
	for t, w := range b.topics {
		out = append(out, TopicBackoff{Topic: t, Failures: w.failures, Until: w.until})
	}
	slices.SortFunc(out, func(a, b TopicBackoff) int { return strings.Compare(a.Topic, b.Topic) })
	return out
}

// TopicBackoffs lists the topics that failed transiently in a row and when each
// is tried again (Until in the past: at the next sweep). A success removes a
// topic from the list.
func (s *Sweeper) TopicBackoffs() []TopicBackoff { return s.backoff.list() }
