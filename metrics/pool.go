package metrics

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector reads pgxpools' statistics at each scrape: they are
// counters and gauges the pools keep already, so a scrape costs a lock and a
// copy a pool.
type poolCollector struct {
	pools                                                      func() []*pgxpool.Pool
	acquired, idle, total, max                                 *prometheus.Desc
	acquires, emptyAcquires, canceled, waitSeconds             *prometheus.Desc
	acquireSeconds, newConns, lifetimeDestroyed, idleDestroyed *prometheus.Desc
}

// RegisterPool registers the statistics of pool, the sweeper's connections to
// Postgres, on reg: outbox_db_pool_*. Waits (acquires that found no idle
// connection) and their time say whether --db-max-conns is too small.
func RegisterPool(reg prometheus.Registerer, pool *pgxpool.Pool) {
	RegisterPools(reg, func() []*pgxpool.Pool { return []*pgxpool.Pool{pool} })
}

// RegisterPools registers the statistics of the pools pools returns at each
// scrape, summed, as RegisterPool does one's: a relay of many databases
// (--databases-file) has a pool, its budget, for each. Summed rather than
// labelled by database, so that a thousand databases make the same dozen
// series as one; a pool let go takes its counts with it, which a rate reads
// as a counter reset.
func RegisterPools(reg prometheus.Registerer, pools func() []*pgxpool.Pool) {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_db_pool_"+name, help, nil, nil)
	}
	reg.MustRegister(&poolCollector{pools: pools,
		acquired:          d("acquired_connections", "Connections in use."),
		idle:              d("idle_connections", "Connections idle in the pool."),
		total:             d("connections", "Connections open, in use, idle or being opened."),
		max:               d("max_connections", "The pool's size."),
		acquires:          d("acquires_total", "Connections taken from the pool."),
		emptyAcquires:     d("acquire_waits_total", "Acquires that found no idle connection and waited for one (or opened one)."),
		canceled:          d("acquires_canceled_total", "Acquires given up (their context ended) before a connection came."),
		waitSeconds:       d("acquire_wait_seconds_total", "Time spent waiting in acquires that found no idle connection."),
		acquireSeconds:    d("acquire_seconds_total", "Time spent in all acquires."),
		newConns:          d("connections_opened_total", "Connections opened."),
		lifetimeDestroyed: d("connections_closed_max_lifetime_total", "Connections closed for their age."),
		idleDestroyed:     d("connections_closed_max_idle_total", "Connections closed for idling."),
	})
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.acquired, c.idle, c.total, c.max, c.acquires, c.emptyAcquires, c.canceled,
		c.waitSeconds, c.acquireSeconds, c.newConns, c.lifetimeDestroyed, c.idleDestroyed} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	var acquired, idle, total, max, acquires, emptyAcquires, canceled, newConns, lifetimeDestroyed, idleDestroyed int64
	var wait, acquire float64
	for _, p := range c.pools() {
		s := p.Stat()
		acquired += int64(s.AcquiredConns())
		idle += int64(s.IdleConns())
		total += int64(s.TotalConns())
		max += int64(s.MaxConns())
		acquires += s.AcquireCount()
		emptyAcquires += s.EmptyAcquireCount()
		canceled += s.CanceledAcquireCount()
		wait += s.EmptyAcquireWaitTime().Seconds()
		acquire += s.AcquireDuration().Seconds()
		newConns += s.NewConnsCount()
		lifetimeDestroyed += s.MaxLifetimeDestroyCount()
		idleDestroyed += s.MaxIdleDestroyCount()
	}
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(c.acquired, float64(acquired))
	gauge(c.idle, float64(idle))
	gauge(c.total, float64(total))
	gauge(c.max, float64(max))
	counter(c.acquires, float64(acquires))
	counter(c.emptyAcquires, float64(emptyAcquires))
	counter(c.canceled, float64(canceled))
	counter(c.waitSeconds, wait)
	counter(c.acquireSeconds, acquire)
	counter(c.newConns, float64(newConns))
	counter(c.lifetimeDestroyed, float64(lifetimeDestroyed))
	counter(c.idleDestroyed, float64(idleDestroyed))
}
