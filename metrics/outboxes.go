package metrics

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// OutboxState is one outbox of a relay of many (--schemas), as its series
// show it.
type OutboxState struct {
	// Name is the outbox's name in the admin API: its schema, or
	// database.schema when the relay serves several databases.
	Name string
	// Tripped names its tripped topics (the process's
	// outbox_topic_tripped{topic} counts the outboxes where each is).
	Tripped []string
	// SweepsFailing counts its sweeps failed in a row (0: the last one
	// succeeded).
	SweepsFailing int
	// Parked says its sweeper waits for a commit: its last sweep found
	// nothing outstanding, and no sweep is under way.
	Parked bool
	// Behind is how far its sweeps are behind the commits
	// (outbox.Sweeper.Behind).
	Behind time.Duration
}

// Backlog is an outbox's backlog, read from the database at a scrape.
type Backlog struct {
	// Rows are its outstanding rows, counted exactly up to 10,000 and
	// estimated above (admin.FleetBacklogCounted).
	Rows int64
	// OldestAgeSeconds is its oldest outstanding row's age; nil: none
	// outstanding.
	OldestAgeSeconds *float64
}

// Outboxes is what the per-outbox series of a relay of many read at each
// scrape.
type Outboxes interface {
	// States says how each outbox stands, from memory.
	States() []OutboxState
	// Backlogs reads the backlogs of the outboxes named, by name: those it
	// could, beside an error for the others (a database down).
	Backlogs(ctx context.Context, names []string) (map[string]Backlog, error)
}

// backlogTimeout bounds a scrape's reading of the backlogs: a scrape that
// waits longer than Prometheus's own timeout (10 s by default) is lost
// whole, the other series with it.
const backlogTimeout = 5 * time.Second

// RegisterOutboxes registers the per-outbox series of a relay of many
// outboxes on reg, read from src at each scrape.
//
// The sweeper's own series are summed over the outboxes by topic name, so
// they say which topic is in trouble but not whose. These say whose, and stay
// bounded: an outbox has series only while it is in trouble (a tripped topic,
// failing sweeps), or always when keep says an operator asked for it
// (--metrics-outboxes). A thousand healthy tenants of ten topics each make
// none; one tenant with a tripped topic makes three. The backlog series cost
// the database a statement or two a scrape, and only while some outbox has
// series; those of a database that does not answer are left out of that
// scrape.
//
// It also exports, read from the same states, the three process-wide gauges
// that a relay of one sets as its breaker and sweeps change (Metrics.ForMany
// takes those out): outbox_topic_tripped{topic}, the number of outboxes
// where the topic is tripped, outbox_sweeps_failed_consecutive, the most of
// any outbox's, and outbox_oldest_outstanding_age_seconds, the most any
// outbox's sweeps are behind (outbox.Sweeper.Behind) or the oldest row of
// an outbox whose backlog the scrape reads. Read from the breakers at each scrape, they count a trip
// another instance made or reset through Redis, and forget a tenant let go;
// set from each outbox's changes, every outbox set them over the others'.
// maxTopics topics (0: MaxTopicsDefault; --metrics-max-topics), those
// tripped in the most outboxes, have outbox_topic_tripped series of their
// own, the rest are counted under _other.
func RegisterOutboxes(reg prometheus.Registerer, src Outboxes, keep func(name string) bool, maxTopics int) {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_tenant_"+name, help, []string{"outbox"}, nil)
	}
	if maxTopics <= 0 {
		maxTopics = MaxTopicsDefault
	}
	reg.MustRegister(&outboxesCollector{src: src, keep: keep, maxTopics: maxTopics,
		topicTripped: prometheus.NewDesc("outbox_topic_tripped", helpTripped, []string{"topic"}, nil),
		mostFailing:  prometheus.NewDesc("outbox_sweeps_failed_consecutive", helpSweepsFailing, nil, nil),
		mostBehind:   prometheus.NewDesc("outbox_oldest_outstanding_age_seconds", helpOldestAge, nil, nil),
		tripped:      d("tripped_topics", "Tripped topics of an outbox of a relay of many (--schemas): only for outboxes with one, or named by --metrics-outboxes."),
		failing:      d("sweeps_failed_consecutive", "Sweeps of an outbox of a relay of many failed in a row: only for outboxes failing, or named by --metrics-outboxes."),
		parked:       d("parked", "1 while an outbox of a relay of many waits for a commit (its last sweep found nothing outstanding): only for outboxes named by --metrics-outboxes."),
		backlog:      d("backlog_messages", "Outstanding rows of an outbox of a relay of many, counted up to 10,000 and Postgres's estimate above: for the outboxes in trouble or named by --metrics-outboxes."),
		oldest:       d("oldest_message_age_seconds", "Age of an outbox's oldest outstanding row, 0 when it holds none, in a relay of many: for the outboxes in trouble or named by --metrics-outboxes."),
	})
}

type outboxesCollector struct {
	src                                       Outboxes
	keep                                      func(name string) bool
	maxTopics                                 int
	tripped, failing, parked, backlog, oldest *prometheus.Desc
	topicTripped, mostFailing, mostBehind     *prometheus.Desc

	// The backlogs read last, for backlogCacheFor: /metrics needs no token,
	// and each scrape read the databases (a count of up to 10,001 rows per
	// outbox in trouble), so whoever could reach the port could load every
	// tenant database at will (an independent review, 2026-11-29). Scrapes
	// at once wait for one read and share it.
	mu       sync.Mutex
	cachedAt time.Time
	cached   map[string]Backlog
	asked    map[string]bool // the names of the last read, read or not (a database down)
}

// backlogCacheFor is how long a scrape answers from the backlogs read last.
const backlogCacheFor = 2 * time.Second

// backlogs returns the backlogs of the outboxes named: those read last, when
// fresh and holding every one, else read now.
func (c *outboxesCollector) backlogs(names []string) map[string]Backlog {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A name asked last time and not read (its database down) is not read
	// again within backlogCacheFor either: each scrape waited out the 5 s
	// timeout under mu, and a second scraper behind it passed its own.
	if time.Since(c.cachedAt) < backlogCacheFor && !slices.ContainsFunc(names, func(n string) bool { return !c.asked[n] }) {
		return c.cached
	}
	ctx, cancel := context.WithTimeout(context.Background(), backlogTimeout)
	defer cancel()
	// Those read: an outbox whose database failed has no backlog series in
	// this scrape, the others keep theirs.
	b, _ := c.src.Backlogs(ctx, names)
	c.cached, c.cachedAt, c.asked = b, time.Now(), make(map[string]bool, len(names))
	for _, n := range names {
		c.asked[n] = true
	}
	return b
}

func (c *outboxesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.tripped, c.failing, c.parked, c.backlog, c.oldest, c.topicTripped, c.mostFailing, c.mostBehind} {
		ch <- d
	}
}

func (c *outboxesCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, name string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
	}
	var shown []string
	states := c.src.States()
	// The lag is the most any outbox's sweeps are behind, or the oldest row
	// of an outbox whose backlog this scrape reads (one in trouble, or named
	// by --metrics-outboxes: the rows of its tripped topics wait too, and
	// its sweeps do not read them).
	behind := c.collectProcess(ch, states).Seconds()
	defer func() { ch <- prometheus.MustNewConstMetric(c.mostBehind, prometheus.GaugeValue, behind) }()
	for _, o := range states {
		kept := c.keep != nil && c.keep(o.Name)
		name := label(o.Name)
		if kept || len(o.Tripped) > 0 || o.SweepsFailing > 0 {
			shown = append(shown, o.Name)
		}
		if kept || len(o.Tripped) > 0 {
			gauge(c.tripped, float64(len(o.Tripped)), name)
		}
		if kept || o.SweepsFailing > 0 {
			gauge(c.failing, float64(o.SweepsFailing), name)
		}
		if kept {
			parked := 0.0
			if o.Parked {
				parked = 1
			}
			gauge(c.parked, parked, name)
		}
	}
	if len(shown) == 0 {
		return
	}
	backlogs := c.backlogs(shown)
	for _, name := range shown {
		b, ok := backlogs[name]
		if !ok {
			continue // gone since States
		}
		gauge(c.backlog, float64(b.Rows), label(name))
		age := 0.0
		if b.OldestAgeSeconds != nil {
			age = *b.OldestAgeSeconds
		}
		gauge(c.oldest, age, label(name))
		behind = max(behind, age)
	}
}

// collectProcess sends the process-wide gauges, summed over states:
// outbox_topic_tripped{topic} and outbox_sweeps_failed_consecutive. It
// returns the most any outbox's sweeps are behind, for
// outbox_oldest_outstanding_age_seconds.
func (c *outboxesCollector) collectProcess(ch chan<- prometheus.Metric, states []OutboxState) time.Duration {
	most := 0
	var behind time.Duration
	in := map[string]int{} // label: outboxes where it is tripped
	for _, o := range states {
		most = max(most, o.SweepsFailing)
		behind = max(behind, o.Behind)
		for _, t := range o.Tripped {
			in[label(t)]++
		}
	}
	ch <- prometheus.MustNewConstMetric(c.mostFailing, prometheus.GaugeValue, float64(most))
	// The most tripped topics by name, the rest under _other: a topic per
	// tenant (an id written as the topic) would otherwise grow the series.
	topics := slices.SortedFunc(maps.Keys(in), func(a, b string) int { return cmp.Or(in[b]-in[a], strings.Compare(a, b)) })
	other := in[OtherTopic]
	for i, t := range topics {
		switch {
		case t == OtherTopic:
		case i < c.maxTopics:
			ch <- prometheus.MustNewConstMetric(c.topicTripped, prometheus.GaugeValue, float64(in[t]), t)
		default:
			other += in[t]
		}
	}
	if other > 0 {
		ch <- prometheus.MustNewConstMetric(c.topicTripped, prometheus.GaugeValue, float64(other), OtherTopic)
	}
	return behind
}
