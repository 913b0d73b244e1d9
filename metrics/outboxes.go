package metrics

import "github.com/prometheus/client_golang/prometheus"

// OutboxState is one outbox of a relay of many (--schemas), as its series
// show it.
type OutboxState struct {
	// Name is the outbox's name in the admin API: its schema, or
	// database.schema when the relay serves several databases.
	Name string
	// TrippedTopics counts its tripped topics.
	TrippedTopics int
	// SweepsFailing counts its sweeps failed in a row (0: the last one
	// succeeded).
	SweepsFailing int
	// Parked says its sweeper waits for a commit: its last sweep found
	// nothing outstanding.
	Parked bool
}

// RegisterOutboxes registers the per-outbox series of a relay of many
// outboxes on reg: list says how each outbox stands, read at each scrape.
//
// The sweeper's own series are summed over the outboxes by topic name, so
// they say which topic is in trouble but not whose. These say whose, and stay
// bounded: an outbox has series only while it is in trouble (a tripped topic,
// failing sweeps), or always when keep says an operator asked for it
// (--metrics-outboxes). A thousand healthy tenants of ten topics each make
// none; one tenant with a tripped topic makes one.
func RegisterOutboxes(reg prometheus.Registerer, list func() []OutboxState, keep func(name string) bool) {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_tenant_"+name, help, []string{"outbox"}, nil)
	}
	reg.MustRegister(&outboxesCollector{list: list, keep: keep,
		tripped: d("tripped_topics", "Tripped topics of an outbox of a relay of many (--schemas): only for outboxes with one, or named by --metrics-outboxes."),
		failing: d("sweeps_failed_consecutive", "Sweeps of an outbox of a relay of many failed in a row: only for outboxes failing, or named by --metrics-outboxes."),
		parked:  d("parked", "1 while an outbox of a relay of many waits for a commit (its last sweep found nothing outstanding): only for outboxes named by --metrics-outboxes."),
	})
}

type outboxesCollector struct {
	list                     func() []OutboxState
	keep                     func(name string) bool
	tripped, failing, parked *prometheus.Desc
}

func (c *outboxesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tripped
	ch <- c.failing
	ch <- c.parked
}

func (c *outboxesCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, name string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
	}
	for _, o := range c.list() {
		kept := c.keep != nil && c.keep(o.Name)
		name := label(o.Name)
		if kept || o.TrippedTopics > 0 {
			gauge(c.tripped, float64(o.TrippedTopics), name)
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
}
