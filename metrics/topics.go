package metrics

import (
	"container/list"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults for [Config].
const (
	// MaxTopicsDefault is how many topics get series of their own.
	MaxTopicsDefault = 200
	// TopicIdleDefault is how long a topic's series outlive its last event.
	TopicIdleDefault = 10 * time.Minute
	// topicHoldDefault is how long a topic keeps its series against a newcomer
	// while every slot is taken.
	topicHoldDefault = time.Minute
	// activeTopicsWindow is the window outbox_active_topics counts over.
	activeTopicsWindow = 5 * time.Minute
)

// OtherTopic is the label value the events of every topic without series of
// its own are counted under, once MaxTopics topics have theirs. It starts with
// an underscore, which no topic a broker accepts is likely to; a real topic of
// that name shares the series.
const OtherTopic = "_other"

// Config configures [NewWithConfig]. The zero value of each field means its
// default.
type Config struct {
	// MaxTopics bounds the topics that get series of their own (in
	// outbox_messages_dispatched_total and the other per-topic metrics, and in
	// outbox_topic_tripped); the events of the rest are counted under
	// topic="_other". A topic seen at every sweep keeps its series; a topic
	// not seen for a minute gives its place to a newcomer when every place is
	// taken. Why: rows that carry a topic each (an application bug writing a
	// UUID as the topic) would otherwise grow the registry, each scrape and
	// Prometheus by about 20 series per row. Defaults to MaxTopicsDefault.
	MaxTopics int
	// TopicIdle is how long after its last event a topic's series are
	// deleted, its place freed. Defaults to TopicIdleDefault.
	TopicIdle time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.MaxTopics <= 0 {
		c.MaxTopics = MaxTopicsDefault
	}
	if c.TopicIdle <= 0 {
		c.TopicIdle = TopicIdleDefault
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// topicLabels hands out the topic label values: a topic's own (escaped, see
// label) while it holds one of max places, else OtherTopic. It is an LRU list
// of the topics with places, most recent first, so that the least recently
// seen one is the first to go: a place costs a map entry and a list element,
// and max of them bound the per-topic series whatever the rows hold.
type topicLabels struct {
	max        int
	idle, hold time.Duration
	now        func() time.Time
	drop       func(label string) // deletes the series of a label that lost its place

	mu     sync.Mutex
	places map[string]*list.Element // topic → element of lru, whose Value is *place
	lru    list.List
	active distinctCounter
}

type place struct {
	topic, label string
	seen         time.Time
}

func newTopicLabels(cfg Config, drop func(string)) *topicLabels {
	return &topicLabels{max: cfg.MaxTopics, idle: cfg.TopicIdle, hold: min(topicHoldDefault, cfg.TopicIdle), now: cfg.Now,
		drop: drop, places: make(map[string]*list.Element), active: newDistinctCounter(cfg.Now())}
}

// of returns topic's label value and counts the topic as seen now.
func (t *topicLabels) of(topic string) string {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.active.add(topic, now)
	if e, ok := t.places[topic]; ok {
		e.Value.(*place).seen = now
		t.lru.MoveToFront(e)
		return e.Value.(*place).label
	}
	t.expireLocked(now)
	if t.lru.Len() >= t.max {
		// Full: the least recently seen topic gives way if it has not been
		// seen for a while, so that a topic seen at every sweep keeps its
		// series and one-off topics take turns.
		last := t.lru.Back()
		if now.Sub(last.Value.(*place).seen) < t.hold {
			return OtherTopic
		}
		t.removeLocked(last)
	}
	l := label(topic)
	if l == OtherTopic {
		return l
	}
	t.places[topic] = t.lru.PushFront(&place{topic: topic, label: l, seen: now})
	return l
}

// known returns topic's label value if it holds a place, without counting it
// as seen.
func (t *topicLabels) known(topic string) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.places[topic]; ok {
		return e.Value.(*place).label, true
	}
	return "", false
}

// expire deletes the series of the topics not seen within idle.
func (t *topicLabels) expire() {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expireLocked(now)
}

func (t *topicLabels) expireLocked(now time.Time) {
	for e := t.lru.Back(); e != nil && now.Sub(e.Value.(*place).seen) >= t.idle; e = t.lru.Back() {
		t.removeLocked(e)
	}
}

func (t *topicLabels) removeLocked(e *list.Element) {
	p := t.lru.Remove(e).(*place)
	delete(t.places, p.topic)
	t.drop(p.label)
}

// len returns how many topics hold places.
func (t *topicLabels) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len()
}

// activeTopics estimates the distinct topics seen within the last window.
func (t *topicLabels) activeTopics() float64 {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.active.estimate(now)
}

// distinctCounter estimates how many distinct topics were seen within the
// last window, in fixed memory, by linear counting: each topic sets one bit of
// a bitmap, chosen by its hash, and n ≈ -m·ln(zero bits / m). With m = 2^17
// bits (16 KiB) the estimate is within a few percent up to about a million
// topics, then saturates (reported as at least that many). Two bitmaps rotate
// every window; the estimate is the larger of the last full window and the
// current one, so the figure neither drops to zero at a rotation nor keeps a
// burst for longer than two windows.
type distinctCounter struct {
	seed      maphash.Seed
	cur, prev *[distinctWords]uint64
	start     time.Time // of cur's window
}

const distinctWords = 1 << 11 // 2^11 words of 64 bits: 2^17 bits

func newDistinctCounter(now time.Time) distinctCounter {
	return distinctCounter{seed: maphash.MakeSeed(), cur: new([distinctWords]uint64), prev: new([distinctWords]uint64), start: now}
}

func (d *distinctCounter) rotate(now time.Time) {
	switch {
	case now.Sub(d.start) >= 2*activeTopicsWindow:
		clear(d.cur[:])
		clear(d.prev[:])
		d.start = now
	case now.Sub(d.start) >= activeTopicsWindow:
		d.cur, d.prev = d.prev, d.cur
		clear(d.cur[:])
		d.start = d.start.Add(activeTopicsWindow)
	}
}

func (d *distinctCounter) add(topic string, now time.Time) {
	d.rotate(now)
	h := maphash.String(d.seed, topic) % (distinctWords * 64)
	d.cur[h/64] |= 1 << (h % 64)
}

func (d *distinctCounter) estimate(now time.Time) float64 {
	d.rotate(now)
	return math.Max(linearCount(d.cur), linearCount(d.prev))
}

func linearCount(bitmap *[distinctWords]uint64) float64 {
	set := 0
	for _, w := range bitmap {
		set += bits.OnesCount64(w)
	}
	const m = distinctWords * 64
	zero := m - set
	if zero == 0 {
		zero = 1 // saturated: the estimate is a floor
	}
	return math.Round(-m * math.Log(float64(zero)/m))
}

// topicVecs are the per-topic vectors whose series a topic loses with its
// place.
type topicVecs []*prometheus.MetricVec

func (v topicVecs) drop(l string) {
	for _, vec := range v {
		vec.DeletePartialMatch(prometheus.Labels{"topic": l})
	}
}
