package metrics

import (
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector reads a pgxpool's statistics at each scrape: they are
// counters and gauges the pool keeps already, so a scrape costs a lock and a
// copy.
type poolCollector struct {
	pool                                                       *pgxpool.Pool
	acquired, idle, total, max                                 *prometheus.Desc
	acquires, emptyAcquires, canceled, waitSeconds             *prometheus.Desc
	acquireSeconds, newConns, lifetimeDestroyed, idleDestroyed *prometheus.Desc
}

// RegisterPool registers the statistics of pool, the sweeper's connections to
// Postgres, on reg: outbox_db_pool_*. Waits (acquires that found no idle
// connection) and their time say whether --db-max-conns is too small.
func RegisterPool(reg prometheus.Registerer, pool *pgxpool.Pool) {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("outbox_db_pool_"+name, help, nil, nil)
	}
	reg.MustRegister(&poolCollector{pool: pool,
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
	s := c.pool.Stat()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(c.acquired, float64(s.AcquiredConns()))
	gauge(c.idle, float64(s.IdleConns()))
	gauge(c.total, float64(s.TotalConns()))
	gauge(c.max, float64(s.MaxConns()))
	counter(c.acquires, float64(s.AcquireCount()))
	counter(c.emptyAcquires, float64(s.EmptyAcquireCount()))
	counter(c.canceled, float64(s.CanceledAcquireCount()))
	counter(c.waitSeconds, s.EmptyAcquireWaitTime().Seconds())
	counter(c.acquireSeconds, s.AcquireDuration().Seconds())
	counter(c.newConns, float64(s.NewConnsCount()))
	counter(c.lifetimeDestroyed, float64(s.MaxLifetimeDestroyCount()))
	counter(c.idleDestroyed, float64(s.MaxIdleDestroyCount()))
}
