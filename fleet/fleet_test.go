package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/fleet"
	"github.com/outbox-sweeper/sweeper/internal/alerttest"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// tenants migrates n tenant outboxes, in schemas base_t000 to base_t<n-1>,
// and drops them at cleanup.
func tenants(t *testing.T, base string, n int) []outbox.Table {
	t.Helper()
	out := make([]outbox.Table, n)
	for i := range out {
		out[i] = outbox.Table{Schema: fmt.Sprintf("%s_t%03d", base, i), Name: "outbox"}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	url := dbtest.URL(t)
	for w := range 4 {
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				errs <- migrate(url, out[i])
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		for _, tbl := range out {
			_, _ = dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{tbl.Schema}.Sanitize()+" CASCADE")
		}
	})
	return out
}

func migrate(url string, tbl outbox.Table) error {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = outbox.Migrate(ctx, conn, tbl)
	return err
}

// logs is a log sink a test can read while the fleet writes to it.
type logs = syncbuf.Buffer

// start runs f (a Fleet or Databases) until the test ends.
func start(t *testing.T, f interface{ Run(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func newFleet(t *testing.T, pattern string, p producer.Producer, poolName string, opts fleet.Options) (*fleet.Fleet, *logs) {
	t.Helper()
	return newFleetOn(t, dbtest.NamedPool(t, poolName), pattern, p, opts)
}

// newFleetOn runs a fleet of pool's outboxes whose schemas match pattern.
func newFleetOn(t *testing.T, pool *pgxpool.Pool, pattern string, p producer.Producer, opts fleet.Options) (*fleet.Fleet, *logs) {
	t.Helper()
	l := &logs{}
	opts.Schemas = pattern
	opts.Logger = slog.New(slog.NewTextHandler(l, nil))
	if opts.Probe.Alerter == nil {
		opts.Probe.Alerter = alert.Log{Logger: opts.Logger}
	}
	opts.Discover = cmpOr(opts.Discover, 200*time.Millisecond)
	f, err := fleet.New(pool, p, opts)
	require.NoError(t, err)
	start(t, f)
	return f, l
}

func slogText(l *logs) *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// adminGet calls the admin API at addr without a token.
func adminGet(t *testing.T, addr, path string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

func cmpOr(a, b time.Duration) time.Duration {
	if a != 0 {
		return a
	}
	return b
}

func write(t *testing.T, tbl outbox.Table, msgs ...outbox.Message) {
	t.Helper()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), msgs...))
}

// sessions counts the sessions whose application_name is name.
func sessions(t *testing.T, name string) int {
	var n int
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name).Scan(&n))
	return n
}

// Rows written into 20 of 200 tenants at random arrive once each, in
// per-topic order, under each tenant's name; a tenant made while the fleet
// runs is relayed, a dropped one let go; and the fleet never holds more
// sessions than its pool and its one LISTEN session.
func TestFleetRelaysManyTenantsOnceEachUnderTheirNames(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 200)
	p := memory.New(memory.Config{MaxBatch: 20})
	name := "fleet-" + base
	f, l := newFleet(t, base+"_t*", p, name, fleet.Options{Destination: "{schema}.{topic}"})
	dbtest.Eventually(t, time.Minute, "every tenant relayed", func() bool { return len(f.Outboxes()) == len(tbls) })

	// The budget: the pool's 6 and the LISTEN session, sampled throughout.
	var most atomic.Int64
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for {
			if n := int64(sessions(t, name)); n > most.Load() {
				most.Store(n)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})

	rng := rand.New(rand.NewPCG(1, 2))
	busy := map[string]outbox.Table{}
	for len(busy) < 20 {
		tbl := tbls[rng.IntN(len(tbls))]
		busy[tbl.Schema] = tbl
	}
	topics := []string{"orders", "payments", "users"}
	want := 0
	var writers sync.WaitGroup
	for _, tbl := range busy {
		writers.Go(func() {
			for tx := range 10 {
				var msgs []outbox.Message
				for i := range 15 {
					msgs = append(msgs, outbox.Message{Topic: topics[(tx+i)%3], Payload: fmt.Appendf(nil, "%s/%d/%d", tbl.Schema, tx, i)})
				}
				write(t, tbl, msgs...)
			}
		})
		want += 150
	}
	writers.Wait()
	dbtest.Eventually(t, 2*time.Minute, "every row delivered", func() bool { return len(p.Messages()) >= want })
	close(stopSampling)
	sampling.Wait()

	seen := map[string]map[int64]int{}
	last := map[string]int64{}
	for _, m := range p.Messages() {
		schema, topic, ok := strings.Cut(m.Topic, ".")
		require.True(t, ok, "destination %q is not {schema}.{topic}", m.Topic)
		require.Contains(t, busy, schema, "a row arrived under a tenant nobody wrote to")
		require.Contains(t, topics, topic)
		require.True(t, strings.HasPrefix(string(m.Payload), schema+"/"), "row %d of %s arrived under %s", m.ID, string(m.Payload), m.Topic)
		if seen[m.Topic] == nil {
			seen[m.Topic] = map[int64]int{}
		}
		seen[m.Topic][m.ID]++
		require.Equal(t, 1, seen[m.Topic][m.ID], "row %d of %s sent twice", m.ID, m.Topic)
		require.Greater(t, m.ID, last[m.Topic], "%s out of order", m.Topic)
		last[m.Topic] = m.ID
	}
	require.Len(t, p.Messages(), want)
	// The last pages' rows are delivered before those pages commit.
	for _, tbl := range busy {
		dbtest.Eventually(t, time.Minute, "every row of "+tbl.String()+" moved out", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	}
	require.LessOrEqual(t, most.Load(), int64(6+1), "the fleet held more sessions than its budget")
	require.Positive(t, most.Load())

	// A tenant made while the fleet runs is relayed within the listing's
	// interval, or at once on its first notification.
	fresh := outbox.Table{Schema: base + "_tnew", Name: "outbox"}
	require.NoError(t, migrate(dbtest.URL(t), fresh))
	t.Cleanup(func() {
		_, _ = dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{fresh.Schema}.Sanitize()+" CASCADE")
	})
	write(t, fresh, outbox.Message{Topic: "orders", Payload: []byte(fresh.Schema + "/0")})
	dbtest.Eventually(t, time.Minute, "the new tenant's row delivered", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return m.Topic == fresh.Schema+".orders" })
	})

	// A dropped tenant is let go, without errors piling up.
	gone := tbls[0]
	_, err := dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{gone.Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "the dropped tenant let go", func() bool {
		_, ok := f.Sweeper(gone)
		return !ok
	})
	require.NotContains(t, l.String(), "level=ERROR", "the fleet logged errors")
}

// A tenant's bad topic trips there only, its poison row goes to its own
// dead-letter table, and another tenant's topic of the same name flows.
func TestFleetKeepsEachTenantsTroubleItsOwn(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	a, b := tbls[0], tbls[1]
	p := memory.New(memory.Config{})
	p.FailTopic(a.Schema+".orders", producer.NewTopicError("topic_not_found", errors.New("no such entity")))
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Destination: "{schema}.{topic}", Admin: admin.Config{Addr: addr}})
	dbtest.Eventually(t, time.Minute, "both tenants relayed", func() bool { return len(f.Outboxes()) == 2 })

	write(t, a, outbox.Message{Topic: "orders", Payload: []byte("a-orders")}, outbox.Message{Topic: "mail", Payload: []byte("a-mail-0")})
	write(t, b, outbox.Message{Topic: "orders", Payload: []byte("b-orders")})
	dbtest.Eventually(t, time.Minute, "b's orders and a's mail delivered", func() bool {
		var got []string
		for _, m := range p.Messages() {
			got = append(got, m.Topic)
		}
		return slices.Contains(got, b.Schema+".orders") && slices.Contains(got, a.Schema+".mail")
	})
	sa, _ := f.Sweeper(a)
	sb, _ := f.Sweeper(b)
	dbtest.Eventually(t, time.Minute, "a's orders tripped", func() bool { return sa.TopicBreaker().State("orders") == breaker.StateTripped })
	require.Equal(t, breaker.StateClosed, sb.TopicBreaker().State("orders"), "b's orders tripped with a's")
	// Once the page that sent a's mail has ended (the producer has the
	// message before the page commits).
	dbtest.Eventually(t, time.Minute, "a's tripped row kept, its mail moved out", func() bool { return dbtest.Outstanding(t, a) == 1 })

	// The per-outbox series name the tenant in trouble, and only it; a
	// tenant an operator named has its series whatever its state. Their
	// backlogs, once the pages that sent a's mail and b's orders have
	// ended: a's, the row its tripped topic holds; b's, none.
	named := func(name string) bool { return name == b.Schema }
	dbtest.Eventually(t, time.Minute, "a's backlog of its tripped row, b's of none", func() bool {
		s := tenantSeries(t, f, named)
		return s["outbox_tenant_backlog_messages{"+a.Schema+"}"] == 1 && s["outbox_tenant_backlog_messages{"+b.Schema+"}"] == 0
	})
	trouble := tenantSeries(t, f, func(string) bool { return false })
	require.Positive(t, trouble["outbox_tenant_oldest_message_age_seconds{"+a.Schema+"}"])
	delete(trouble, "outbox_tenant_oldest_message_age_seconds{"+a.Schema+"}")
	require.Equal(t, map[string]float64{"outbox_tenant_backlog_messages{" + a.Schema + "}": 1, "outbox_tenant_tripped_topics{" + a.Schema + "}": 1},
		trouble, "only a, in trouble, has series")
	series := tenantSeries(t, f, named)
	require.Contains(t, series, "outbox_tenant_backlog_messages{"+b.Schema+"}")
	require.Contains(t, series, "outbox_tenant_oldest_message_age_seconds{"+b.Schema+"}")
	require.Equal(t, 0.0, series["outbox_tenant_oldest_message_age_seconds{"+b.Schema+"}"], "b holds nothing")
	require.Equal(t, 1.0, series["outbox_tenant_tripped_topics{"+a.Schema+"}"])
	require.Equal(t, 0.0, series["outbox_tenant_tripped_topics{"+b.Schema+"}"])
	require.Contains(t, series, "outbox_tenant_sweeps_failed_consecutive{"+b.Schema+"}")
	require.Contains(t, series, "outbox_tenant_parked{"+b.Schema+"}")
	require.NotContains(t, series, "outbox_tenant_parked{"+a.Schema+"}", "a's parked series, a not named")

	// A poison row of a's: dead-lettered in a's table, none in b's. The
	// broker is told to refuse it before it commits: after, a's sweeper may
	// have sent it already.
	var poison int64
	w, err := outbox.NewWriter(a)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(context.Background(), dbtest.Pool(t), func(tx pgx.Tx) error {
		if err := w.Write(context.Background(), tx, outbox.Message{Topic: "mail", Payload: []byte("poison")}); err != nil {
			return err
		}
		if err := tx.QueryRow(context.Background(), "SELECT max(id) FROM "+a.Ident()).Scan(&poison); err != nil {
			return err
		}
		p.FailMessage(poison, producer.NewMessageError(producer.ReasonInvalidMessage, []int64{poison}, errors.New("unparseable")))
		return nil
	}))
	dbtest.Eventually(t, time.Minute, "a's poison row dead-lettered", func() bool { return deadLetters(t, a) == 1 })
	// GET /outboxes lists a first (in trouble), with its dead letter, and
	// b with none. The counts are Postgres's statistics, seconds behind.
	dbtest.Eventually(t, time.Minute, "GET /outboxes: a's dead letter, none of b's", func() bool {
		code, body := adminGet(t, addr, "/outboxes")
		require.Equal(t, 200, code, "%v", body)
		list := body["outboxes"].([]any)
		require.Len(t, list, 2)
		first, second := list[0].(map[string]any), list[1].(map[string]any)
		require.Equal(t, a.Schema, first["name"], "the tenant in trouble listed first")
		return first["dead_letters_estimate"] == 1.0 && second["dead_letters_estimate"] == 0.0
	})
	write(t, b, outbox.Message{Topic: "mail", Payload: []byte("b-mail")})
	dbtest.Eventually(t, time.Minute, "b's mail delivered", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return m.Topic == b.Schema+".mail" })
	})
	require.Zero(t, deadLetters(t, b))
	// Delivered before its page commits: outstanding until then.
	dbtest.Eventually(t, time.Minute, "b's mail moved out", func() bool { return dbtest.Outstanding(t, b) == 0 })
}

// tenantSeries scrapes the per-outbox series of src, keeping keep's: each
// series' value by name{outbox}.
func tenantSeries(t *testing.T, src metrics.Outboxes, keep func(string) bool) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	metrics.RegisterOutboxes(reg, src, keep, 0)
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range families {
		if !strings.HasPrefix(mf.GetName(), "outbox_tenant_") {
			continue // the process's, read from the same states
		}
		for _, m := range mf.GetMetric() {
			out[mf.GetName()+"{"+m.GetLabel()[0].GetValue()+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

func deadLetters(t *testing.T, tbl outbox.Table) int {
	var n int
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT count(*) FROM "+tbl.DeadLetterIdent()).Scan(&n))
	return n
}

// waitParked waits until f relays tbls and each of their sweepers parked.
func waitParked(t *testing.T, f *fleet.Fleet, tbls []outbox.Table) {
	t.Helper()
	dbtest.Eventually(t, time.Minute, "every sweeper parked", func() bool {
		if len(f.Outboxes()) != len(tbls) {
			return false
		}
		for _, tbl := range tbls {
			if s, _ := f.Sweeper(tbl); !s.Parked() {
				return false
			}
		}
		return true
	})
}

// alerts records the outbox and dead-letter table of each alert.
type alerts struct {
	mu     sync.Mutex
	tables []string
}

func (a *alerts) Alert(_ context.Context, al alert.Alert) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.tables = append(a.tables, al.Outbox+" "+al.Table)
	return nil
}

func (a *alerts) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.tables)
}

// Maintenance (retention and the dead-letter probe) runs for the tenants
// whose sweeps moved rows; the sweeps every tenant makes at the start, which
// find nothing, do not count. Every tenant holds a dead letter the probe
// would alert about, so an alert shows which tenants the probe ran for.
func TestFleetMaintainsOnlyTheTenantsThatMovedRows(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 6)
	for i, tbl := range tbls {
		_, err := dbtest.Pool(t).Exec(context.Background(), "INSERT INTO "+tbl.DeadLetterIdent()+
			" (id, message_id, topic, payload, created_at, reason) VALUES ($1, gen_random_uuid(), 'orders', 'x', now(), 'invalid_message')", i+1)
		require.NoError(t, err)
	}
	got := &alerts{}
	p := memory.New(memory.Config{})
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{
		Reconcile: time.Hour, Maintenance: 100 * time.Millisecond, IdleMaintenance: time.Hour,
		Probe: outbox.ProbeConfig{Alerter: got, Threshold: 1},
	})
	waitParked(t, f, tbls)
	// Each write is followed by its own tenant's alert: maintenance rounds
	// ran meanwhile, and any tenant the start-up sweeps had marked busy
	// would have been probed in them.
	for _, i := range []int{2, 4} {
		write(t, tbls[i], outbox.Message{Topic: "orders", Payload: []byte("moved")})
		dbtest.Eventually(t, time.Minute, "the probe of the tenant that moved a row", func() bool {
			return slices.Contains(got.seen(), tbls[i].Schema+" outbox_dead_letter")
		})
	}
	require.ElementsMatch(t, []string{tbls[2].Schema + " outbox_dead_letter", tbls[4].Schema + " outbox_dead_letter"}, got.seen(),
		"the probe ran for tenants that moved no row")
}

// An idle tenant's sweeper parks, a commit wakes it at once, and a row that
// notified nobody is found by the reconciliation.
func TestFleetParksIdleTenantsAndReconciles(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 3)
	p := memory.New(memory.Config{})
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Reconcile: time.Hour})
	waitParked(t, f, tbls)
	// With reconciliation an hour away, only the notification can wake it.
	write(t, tbls[1], outbox.Message{Topic: "orders", Payload: []byte("woken")})
	dbtest.Eventually(t, 30*time.Second, "the row delivered on its notification", func() bool { return len(p.Messages()) == 1 })
	dbtest.Eventually(t, time.Minute, "the sweeper parked again", func() bool {
		s, _ := f.Sweeper(tbls[1])
		return s.Parked()
	})

	// A row whose commit notified nobody (triggers off, as a restore or a
	// replica's apply does) waits for the reconciliation, which finds it by
	// its table's insert count: the passes over every outbox in turn are
	// left out.
	f2, _ := newFleet(t, base+"_t*", p, "fleet2-"+base, fleet.WithoutSlices(fleet.Options{Reconcile: 300 * time.Millisecond}))
	dbtest.Eventually(t, time.Minute, "the second fleet relaying", func() bool { return len(f2.Outboxes()) == len(tbls) })
	waitParked(t, f2, tbls)
	passedParked(t, f2)
	silently(t, "silent", "", tbls[2])
	dbtest.Eventually(t, time.Minute, "the silent row delivered by reconciliation", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "silent" })
	})
}

// A row that notified nobody and that Postgres did not count (written with
// triggers off in a session with track_counts off) is found by the pass
// that asks its parked outbox in turn, whatever the counts say.
func TestFleetReconcilesWhatTheInsertCountsMiss(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 3)
	p := memory.New(memory.Config{})
	// Each outbox asked in turn once in 5 passes of 100 ms.
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.InTurnEvery(fleet.Options{Reconcile: 100 * time.Millisecond}, 5))
	waitParked(t, f, tbls)
	passedParked(t, f)
	silently(t, "uncounted", "SET LOCAL track_counts = off", tbls[1])
	dbtest.Eventually(t, time.Minute, "the uncounted row delivered by reconciliation", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "uncounted" })
	})
}

// A tenant's schema dropped and made again between two listings (a tenant
// reset; here replaced in one transaction, then dropped) is relayed as the
// new outbox it is, by the sweeper that relayed the old one, and nothing of
// it is lost. The new table's ids start again from
// 1. Here the old rows went out less than a second before the drop, and
// the sweeper's floors may still lie below the new ids, which its wake-up
// sweep then finds itself. Once the floors have moved past them (a tenant
// busy for a second or more), that sweep does not see them, and the
// reconciliation finds them by the table's insert count or its new
// identity (TestFleetAsksAnOutboxMadeAgainWhoseCountMeetsTheOld): in a
// trial with the floors moved and the reconciliation off, they waited
// (2026-11-29).
func TestFleetRelaysASchemaMadeAgainBetweenListings(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	reset := tbls[1]
	p := memory.New(memory.Config{})
	// The passes in turn left out: one that asked the dropped table (its
	// turn comes once in 120 passes) would fail and list the schemas again
	// (CI, 2026-11-29).
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.WithoutSlices(fleet.Options{Discover: time.Hour, Reconcile: 200 * time.Millisecond}))
	// The new table, migrated beforehand under a name the pattern does not
	// match, takes the old one's place in one transaction, and the old one is
	// dropped: with a drop and a migration one after the other, a pass that
	// came between them asked the missing table, failed and listed the
	// schemas again, as a relay would, and the test showed nothing (CI, a
	// loaded machine, 2026-11-29).
	_, swap := spareSchema(t, base)
	waitParked(t, f, tbls)
	var old []outbox.Message
	for i := range 20 {
		old = append(old, outbox.Message{Topic: "orders", Payload: fmt.Appendf(nil, "old-%d", i)})
	}
	// From a session of its own, whose end reports the insert count at once:
	// a count reported late would have a pass ask the old table as it goes,
	// fail, and list the schemas again (CI, 2026-11-29).
	w, err := outbox.NewWriter(reset)
	require.NoError(t, err)
	conn, err := pgx.Connect(context.Background(), dbtest.URL(t))
	require.NoError(t, err)
	require.NoError(t, w.Write(context.Background(), conn, old...))
	require.NoError(t, conn.Close(context.Background()))
	dbtest.Eventually(t, time.Minute, "the old table's rows delivered", func() bool { return len(p.Messages()) == len(old) })
	waitParked(t, f, tbls)
	passedParked(t, f) // the moved count compared: no pass asks the old table again
	before, _ := f.Sweeper(reset)

	swap(reset)
	_, err = dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{base + "_old"}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	write(t, reset, outbox.Message{Topic: "orders", Payload: []byte("new-0")}, outbox.Message{Topic: "orders", Payload: []byte("new-1")})
	dbtest.Eventually(t, time.Minute, "the new table's rows delivered", func() bool { return len(p.Messages()) == len(old)+2 })
	dbtest.Eventually(t, time.Minute, "the new table's rows marked sent", func() bool { return dbtest.Outstanding(t, reset) == 0 })
	after, _ := f.Sweeper(reset)
	// Compared, not printed: printing a running sweeper races with it.
	require.True(t, before == after, "the listing ran between the drop and the new schema: the test shows nothing")
	var got []string
	for _, m := range p.Messages()[len(old):] {
		got = append(got, string(m.Payload))
	}
	require.Equal(t, []string{"new-0", "new-1"}, got)
}

// The reconciliation tells a table made again under an outbox's name by its
// identity, not only by its insert count, which starts again and may meet
// the old table's. Here the two are swapped in one transaction (so that no
// pass finds the outbox missing, which would have it asked anyway), each has
// had one row inserted, the new one silently, and only the insert counts
// can find it: the passes in turn are left out, and the listing is an hour
// away.
func TestFleetAsksAnOutboxMadeAgainWhoseCountMeetsTheOld(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	reset := tbls[1]
	_, swap := spareSchema(t, base)
	p := memory.New(memory.Config{})
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.WithoutSlices(fleet.Options{Discover: time.Hour, Reconcile: 100 * time.Millisecond}))
	waitParked(t, f, tbls)
	passedParked(t, f)
	silently(t, "old", "", reset)
	dbtest.Eventually(t, time.Minute, "the old table's row delivered", func() bool { return len(p.Messages()) == 1 })
	waitParked(t, f, tbls)
	passedParked(t, f) // its count of one compared while parked

	swap(reset)
	silently(t, "new", "", reset)
	dbtest.Eventually(t, time.Minute, "the new table's row delivered", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "new" })
	})
}

// The listing, too, tells a table made again under an outbox's name by its
// identity, and has its sweeper read it from its first row: with the
// reconciliation an hour away, a row that notified nobody in the new table
// is found at the next listing.
func TestFleetListingFindsAnOutboxMadeAgain(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	reset := tbls[1]
	spare, swap := spareSchema(t, base)
	p := memory.New(memory.Config{})
	f, l := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Reconcile: time.Hour})
	waitParked(t, f, tbls)
	// Written before the swap: the listing that finds the new table may
	// come at once.
	silently(t, "new", "", spare)
	swap(reset)
	dbtest.Eventually(t, time.Minute, "the new table's row delivered", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "new" })
	})
	require.Contains(t, l.String(), "outbox made again under its name")
}

// spareSchema migrates an outbox in a schema the tests' patterns do not
// match, and returns a func that swaps it with tbl's schema in one
// transaction: tbl is made again under its name, with no moment in which
// it is missing.
func spareSchema(t *testing.T, base string) (spare outbox.Table, swap func(tbl outbox.Table)) {
	t.Helper()
	spare = outbox.Table{Schema: base + "_spare", Name: "outbox"}
	require.NoError(t, migrate(dbtest.URL(t), spare))
	ctx := context.Background()
	t.Cleanup(func() {
		for _, s := range []string{spare.Schema, base + "_old"} {
			_, _ = dbtest.Pool(t).Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE")
		}
	})
	return spare, func(tbl outbox.Table) {
		t.Helper()
		require.NoError(t, pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error {
			for _, q := range []string{
				"ALTER SCHEMA " + pgx.Identifier{tbl.Schema}.Sanitize() + " RENAME TO " + pgx.Identifier{base + "_old"}.Sanitize(),
				"ALTER SCHEMA " + pgx.Identifier{spare.Schema}.Sanitize() + " RENAME TO " + pgx.Identifier{tbl.Schema}.Sanitize(),
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		}))
	}
}

// passedParked waits for two reconciliation passes of f, the outboxes
// parked: each has been compared once, and its next count is what finds it.
func passedParked(t *testing.T, f *fleet.Fleet) {
	t.Helper()
	from := f.ReconcilePasses()
	dbtest.Eventually(t, time.Minute, "two reconciliation passes", func() bool { return f.ReconcilePasses() >= from+2 })
}

// silently writes a row of payload body into each of tbls, in one
// transaction with triggers off, so that its commit notifies nobody, after
// the statement also if not empty. Its session ends then, which reports its
// insert counts at once: a session that reported less than a second before
// holds them back for up to 10 s (Postgres 15's PGSTAT_IDLE_INTERVAL).
func silently(t *testing.T, body, also string, tbls ...outbox.Table) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, q := range []string{"SET LOCAL session_replication_role = replica", also} {
			if q == "" {
				continue
			}
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		for _, tbl := range tbls {
			if _, err := tx.Exec(ctx, "INSERT INTO "+tbl.Ident()+" (topic, payload) VALUES ('orders', $1)", []byte(body)); err != nil {
				return err
			}
		}
		return nil
	}))
}

// A reconciliation statement that fails (here, an outbox it asks was
// dropped after the counts were read) does not lose what the counts said of
// the other outboxes it asked: each is asked again at the next pass, and
// its row, whose commit notified nobody, is delivered. The passes in turn
// are left out, so only that ask again can find it.
func TestFleetAsksAgainWhatAFailedReconciliationAsked(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 3)
	gone, kept := tbls[0], tbls[2] // in one chunk
	p := memory.New(memory.Config{})
	var armed, dropped atomic.Bool
	drop := func(schemas []string) {
		if !armed.Load() || !slices.Contains(schemas, gone.Schema) || !slices.Contains(schemas, kept.Schema) || dropped.Load() {
			return
		}
		if _, err := dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{gone.Schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop %s: %v", gone.Schema, err)
			return
		}
		dropped.Store(true)
	}
	f, l := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Asking(fleet.WithoutSlices(fleet.Options{Reconcile: 100 * time.Millisecond}), drop))
	waitParked(t, f, tbls)
	passedParked(t, f)
	// Each outbox has been compared once: from here only a moved count
	// asks it. One transaction, so that one pass finds both counts moved.
	armed.Store(true)
	silently(t, "kept", "", gone, kept)
	dbtest.Eventually(t, time.Minute, "the kept outbox's row delivered", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "kept" })
	})
	require.True(t, dropped.Load(), "no pass asked both outboxes at once")
	require.Contains(t, l.String(), "reconciliation failed", "the pass that asked the dropped outbox did not fail")
	dbtest.Eventually(t, time.Minute, "the kept outbox's row marked sent", func() bool { return dbtest.Outstanding(t, kept) == 0 })
}

// An outbox whose inserts Postgres does not count for the relay (its own
// session reads track_counts off; a partitioned table is the same) is asked
// in turn every fullReconcileUncounted passes, not once in the hour: a row
// written in a session that counts nothing either is found within ten
// passes of 100 ms, where a thousand would take 100 s.
func TestFleetAsksUncountedOutboxesInTurnMoreOften(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 3)
	p := memory.New(memory.Config{})
	cfg, err := pgxpool.ParseConfig(dbtest.NamedURL(t, dbtest.URL(t), "fleet-"+base))
	require.NoError(t, err)
	cfg.MaxConns = 6
	cfg.ConnConfig.RuntimeParams["track_counts"] = "off"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f, _ := newFleetOn(t, pool, base+"_t*", p, fleet.InTurnEvery(fleet.Options{Reconcile: 100 * time.Millisecond}, 1000))
	waitParked(t, f, tbls)
	passedParked(t, f)
	silently(t, "uncounted", "SET LOCAL track_counts = off", tbls[1])
	dbtest.Eventually(t, time.Minute, "the uncounted row delivered by reconciliation", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "uncounted" })
	})
}

// A partitioned outbox table counts its inserts in its partitions, its own
// count staying 0: a row whose commit notified nobody never moves it, and is
// found by the pass in turn, which comes as often as for an uncounted table.
// Turns are otherwise a thousand passes apart here, so only that can find it.
func TestFleetAsksPartitionedOutboxesInTurnMoreOften(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 3)
	// The migrated table becomes the one partition of a table partitioned
	// by id, under the outbox's name; its trigger and indexes stay on it.
	s := pgx.Identifier{tbls[1].Schema}.Sanitize()
	for _, q := range []string{
		"ALTER TABLE " + s + ".outbox RENAME TO outbox_p0",
		"CREATE TABLE " + s + ".outbox (LIKE " + s + ".outbox_p0 INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING IDENTITY) PARTITION BY RANGE (id)",
		"ALTER TABLE " + s + ".outbox_p0 ALTER COLUMN id DROP IDENTITY",
		"ALTER TABLE " + s + ".outbox_p0 VALIDATE CONSTRAINT outbox_created_at_finite",
		"ALTER TABLE " + s + ".outbox ATTACH PARTITION " + s + ".outbox_p0 FOR VALUES FROM (MINVALUE) TO (MAXVALUE)",
	} {
		_, err := dbtest.Pool(t).Exec(context.Background(), q)
		require.NoError(t, err, q)
	}
	p := memory.New(memory.Config{})
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.InTurnEvery(fleet.Options{Reconcile: 100 * time.Millisecond}, 1000))
	write(t, tbls[1], outbox.Message{Topic: "orders", Payload: []byte("notified")})
	dbtest.Eventually(t, time.Minute, "the partitioned outbox's first row delivered", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "notified" })
	})
	waitParked(t, f, tbls)
	passedParked(t, f)
	silently(t, "partitioned", "", tbls[1])
	dbtest.Eventually(t, time.Minute, "the partitioned outbox's silent row delivered by reconciliation", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "partitioned" })
	})
}

// Sweeps take turns, and a busy tenant yields its turn after a page while
// others wait: five tenants' backlogs do not keep a quiet tenant's row
// waiting for their drains. The rows sent between its commit and its
// arrival are counted, not timed: those of the drains until its
// notification comes, then a page of each turn (0 to 1,600 of about
// 18,000 left, under -race and a CPU hog too), where drains that kept
// their turns for their sweeps' whole span (a second) sent nearly all of
// them (15,800 to 18,200 with Waiting always false). Backlogs large enough
// to outlast that span would no longer tell the two apart by a share of
// them: 14,400 of 38,400 without the yield, at 8,000 each.
func TestFleetSharesTurnsAmongBusyTenants(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 6)
	quiet := make(chan int64, 1)
	var sent atomic.Int64
	p := memory.New(memory.Config{MaxBatch: 50})
	p.SetSendFunc(func(ctx context.Context, b producer.Batch) error {
		n := sent.Add(int64(len(b.Messages)))
		if b.Topic == "quiet" {
			select {
			case quiet <- n:
			default:
			}
		}
		return nil
	})
	// Five tenants with a backlog each, written before the fleet starts.
	const busy, backlog = 5, 4000
	for _, tbl := range tbls[:busy] {
		var msgs []outbox.Message
		for i := range backlog {
			msgs = append(msgs, outbox.Message{Topic: fmt.Sprintf("t%d", i%4), Payload: []byte("x")})
		}
		write(t, tbl, msgs...)
	}
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Sweeper: outbox.Config{PageSize: 200}})
	dbtest.Eventually(t, time.Minute, "the drains under way", func() bool { return len(p.Messages()) > 1000 })
	write(t, tbls[5], outbox.Message{Topic: "quiet", Payload: []byte("q")})
	written, before := time.Now(), sent.Load() // from its commit
	var upTo int64
	dbtest.Eventually(t, time.Minute, "the quiet tenant's row delivered", func() bool {
		select {
		case upTo = <-quiet:
			return true
		default:
			return false
		}
	})
	between, left := upTo-1-before, busy*backlog-before
	t.Logf("quiet row after %s, behind %d of the %d backlog rows left at its commit", time.Since(written), between, left)
	require.Less(t, between, left/2, "the quiet row waited for most of the busy tenants' drains rather than a page of each turn")
	dbtest.Eventually(t, 2*time.Minute, "every backlog drained", func() bool { return len(p.Messages()) == busy*backlog+1 })
	require.Len(t, f.Outboxes(), 6)
}

// A drain gives way to quiet tenants' sweeps (turns.go) and is never stopped
// by them: while a quiet tenant commits row after row without a pause, so
// that its sweeps keep starting, a busy tenant's backlog still drains, quiet
// rows arrive during the drain, not after it, and every row of both arrives
// once.
//
// The backlog is committed once both tenants are relayed and the quiet one's
// rows flow: a fleet starts each outbox it finds once it has added it (a few
// statements), and on a database whose catalogs had grown (autovacuum off, a
// day of test schemas) adding the quiet tenant outlasted the whole drain of a
// backlog found at start, which says nothing about turns.
func TestFleetDrainsBesideAStreamOfQuietCommits(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	busy, quiet := tbls[0], tbls[1]
	const backlog = 3000
	p := memory.New(memory.Config{})
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Sweeper: outbox.Config{PageSize: 100}})
	dbtest.Eventually(t, time.Minute, "both tenants relayed", func() bool { return len(f.Outboxes()) == 2 })

	stop := make(chan struct{})
	var written atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		w, err := outbox.NewWriter(quiet)
		if err != nil {
			t.Error(err)
			return
		}
		pool := dbtest.Pool(t)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := w.Write(context.Background(), pool, outbox.Message{Topic: "quiet", Payload: fmt.Appendf(nil, "q%d", i)}); err != nil {
				t.Error(err)
				return
			}
			written.Add(1)
		}
	})
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt()
	dbtest.Eventually(t, time.Minute, "the quiet tenant's rows flowing", func() bool { return len(p.Messages()) > 0 })
	var msgs []outbox.Message
	for i := range backlog {
		msgs = append(msgs, outbox.Message{Topic: fmt.Sprintf("busy-%d", i%3), Payload: fmt.Appendf(nil, "b%d", i)})
	}
	before := written.Load()
	write(t, busy, msgs...)
	dbtest.Eventually(t, 2*time.Minute, "the busy tenant drained while the quiet one commits", func() bool {
		return dbtest.Outstanding(t, busy) == 0
	})
	halt()
	// A drain waits at most a hold for each page while quiet sweeps keep
	// starting: a few quiet commits to a page of 100 rows, fewer than one to
	// a row. A drain that waited for lulls alone took tens of thousands.
	beside := written.Load() - before
	require.Less(t, beside, int64(5*backlog), "the drain waited on the quiet tenant's commits rather than taking its turns")
	dbtest.Eventually(t, time.Minute, "every row delivered", func() bool { return len(p.Messages()) >= backlog+int(written.Load()) })

	got := p.Messages()
	seen := map[string]bool{}
	firstBusy, lastBusy := -1, -1
	for i, m := range got {
		require.False(t, seen[string(m.Payload)], "%s delivered twice", m.Payload)
		seen[string(m.Payload)] = true
		if strings.HasPrefix(m.Topic, "busy-") {
			if firstBusy < 0 {
				firstBusy = i
			}
			lastBusy = i
		}
	}
	require.Len(t, got, backlog+int(written.Load()))
	during := 0
	for _, m := range got[firstBusy:lastBusy] {
		if m.Topic == "quiet" {
			during++
		}
	}
	require.Positive(t, during, "no quiet row arrived during the drain: the quiet rows waited for the whole drain")
	t.Logf("%d busy rows drained beside %d quiet commits, %d quiet rows delivered during the drain", backlog, beside, during)
}

// A relay of many knows, without a statement, how far each tenant's sweeps
// are behind: while a drain's rows wait (here, for a broker that holds its
// sends), the age of the oldest row of its page, which grows as they wait;
// 0 for a tenant with nothing to send, and for the drained one once it is
// done. The metrics' lag (outbox_oldest_outstanding_age_seconds) is the
// most of them.
func TestFleetKnowsHowFarATenantIsBehind(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	busy, idle := tbls[0], tbls[1]
	release := make(chan struct{})
	p := memory.New(memory.Config{})
	p.SetSendFunc(func(ctx context.Context, _ producer.Batch) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	written := time.Now()
	var msgs []outbox.Message
	for i := range 300 {
		msgs = append(msgs, outbox.Message{Topic: "orders", Payload: fmt.Appendf(nil, "%d", i)})
	}
	write(t, busy, msgs...)
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Sweeper: outbox.Config{PageSize: 100}})
	behind := func(tbl outbox.Table) time.Duration {
		for _, st := range f.States() {
			if st.Name == tbl.Schema {
				return st.Behind
			}
		}
		return -1
	}
	dbtest.Eventually(t, time.Minute, "both tenants relayed, the busy one behind", func() bool {
		return len(f.Outboxes()) == 2 && behind(busy) > 0
	})
	require.LessOrEqual(t, behind(busy), time.Since(written)+time.Second, "older than its rows")
	require.Zero(t, behind(idle), "a tenant with nothing to send")

	close(release)
	dbtest.Eventually(t, time.Minute, "the busy tenant drained", func() bool { return dbtest.Outstanding(t, busy) == 0 })
	dbtest.Eventually(t, time.Minute, "the busy tenant no longer behind", func() bool { return behind(busy) == 0 })
	require.Len(t, distinct(p), 300)
}

// A parked tenant woken by a commit lists as sweeping from its wake-up, not
// from the end of the sweep it woke for: the admin API counts the backlogs
// of sweeping tenants only, and one whose first row in a while was being
// sent listed a backlog of 0 (Parked keeps the sweep before's finding until
// the sweep ends; the reconciliation reads that).
func TestFleetListsAWokenTenantAsSweeping(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	a := tbls[0]
	p := memory.New(memory.Config{})
	entered, release := make(chan struct{}, 1), make(chan struct{})
	p.SetSendFunc(func(ctx context.Context, _ producer.Batch) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{})
	dbtest.Eventually(t, time.Minute, "every tenant relayed", func() bool { return len(f.Outboxes()) == len(tbls) })
	sa, _ := f.Sweeper(a)
	listedParked := func() bool {
		for _, st := range f.States() {
			if st.Name == a.Schema {
				return st.Parked
			}
		}
		t.Fatalf("%s not in the fleet's states", a.Schema)
		return false
	}
	dbtest.Eventually(t, time.Minute, "a parked", func() bool { return sa.Parked() && listedParked() })

	write(t, a, outbox.Message{Topic: "orders", Payload: []byte("held")})
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("a's row was not sent within a minute of its commit")
	}
	require.True(t, sa.Parked(), "the sweep before's finding is kept while the woken sweep runs")
	require.False(t, listedParked(), "a lists as parked while its row is being sent")
	close(release)
	dbtest.Eventually(t, time.Minute, "a's row sent", func() bool { return dbtest.Outstanding(t, a) == 0 })
	dbtest.Eventually(t, time.Minute, "a parked again", listedParked)
}

// The admin API of a fleet: GET /outboxes lists the tenants, those in
// trouble first; each tenant's API, the one a relay of one outbox serves,
// answers under /outboxes/{schema}/, and an operator resets a tenant's
// tripped topic there without touching another's.
func TestFleetAdminAPIServesEachTenant(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 3)
	a := tbls[1]
	p := memory.New(memory.Config{})
	p.FailTopic("orders", producer.NewTopicError("topic_not_found", errors.New("no such entity")))
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	const token = "fleet-admin-token"
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Admin: admin.Config{Addr: addr, Token: token, UI: true}})
	dbtest.Eventually(t, time.Minute, "every tenant relayed", func() bool { return len(f.Outboxes()) == len(tbls) })
	write(t, a, outbox.Message{Topic: "orders", Payload: []byte("a-orders")})
	sa, _ := f.Sweeper(a)
	dbtest.Eventually(t, time.Minute, "a's orders tripped", func() bool { return sa.TopicBreaker().State("orders") == breaker.StateTripped })
	// The trip is seen before the sweep that made it ends, and until then
	// a reads as parked (its last sweep, before the row, found nothing):
	// the list counts no parked tenant's backlog (CI, once, read 0).
	dbtest.Eventually(t, time.Minute, "a's sweep ended, a not parked", func() bool { return !sa.Parked() })

	call := func(method, path string, withToken bool) (int, map[string]any) {
		req, err := http.NewRequest(method, "http://"+addr+path, nil)
		require.NoError(t, err)
		if withToken {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if method == http.MethodPost {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		return resp.StatusCode, body
	}
	code, _ := call("GET", "/healthz", false)
	require.Equal(t, http.StatusOK, code)
	code, _ = call("GET", "/readyz", false)
	require.Equal(t, http.StatusOK, code)
	code, _ = call("GET", "/outboxes", false)
	require.Equal(t, http.StatusUnauthorized, code, "the list needs the token")

	code, body := call("GET", "/outboxes", true)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.EqualValues(t, 3, body["total"])
	list := body["outboxes"].([]any)
	require.Len(t, list, 3)
	first := list[0].(map[string]any)
	require.Equal(t, a.Schema, first["schema"], "the tenant in trouble comes first")
	require.Equal(t, []any{"orders"}, first["tripped_topics"])
	require.Equal(t, "/outboxes/"+a.Schema+"/", first["path"])
	// Counted, not estimated: the estimates may read an empty tenant as
	// holding a row or two.
	require.EqualValues(t, 1, first["backlog"], "a's row waits on its tripped topic")
	require.NotNil(t, first["oldest_age_seconds"])
	for _, o := range list[1:] {
		require.Empty(t, o.(map[string]any)["tripped_topics"])
		require.EqualValues(t, 0, o.(map[string]any)["backlog"])
		require.Nil(t, o.(map[string]any)["oldest_age_seconds"])
	}

	code, body = call("GET", "/outboxes/"+a.Schema+"/status", true)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Contains(t, fmt.Sprint(body), "orders", "the tenant's status names its tripped topic")
	code, body = call("GET", "/outboxes/"+tbls[0].Schema+"/topics/tripped", true)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.NotContains(t, fmt.Sprint(body), "orders", "another tenant's page shows none of a's")
	code, _ = call("GET", "/outboxes/"+a.Schema+"/status", false)
	require.Equal(t, http.StatusUnauthorized, code, "a tenant's API needs the token too")
	code, body = call("GET", "/outboxes/nobody/status", true)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body["error"], "GET /outboxes lists")

	// A topic with a / in its name, escaped as one segment, reaches the
	// tenant's own route.
	code, body = call("POST", "/outboxes/"+a.Schema+"/topics/"+url.PathEscape("eu/orders")+"/trip", true)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, breaker.StateTripped, sa.TopicBreaker().State("eu/orders"))
	code, body = call("POST", "/outboxes/"+a.Schema+"/topics/"+url.PathEscape("eu/orders")+"/reset", true)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, breaker.StateClosed, sa.TopicBreaker().State("eu/orders"))

	p.HealTopic("orders")
	code, body = call("POST", "/outboxes/"+a.Schema+"/topics/orders/reset", true)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, breaker.StateClosed, sa.TopicBreaker().State("orders"))
	dbtest.Eventually(t, time.Minute, "a's row sent once its topic is reset", func() bool { return dbtest.Outstanding(t, a) == 0 })

	// The fleet's console lists the outboxes; a tenant's loads its files
	// relative to its page.
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(page), `src="ui/fleet.js"`)
	resp, err = http.Get("http://" + addr + "/ui/fleet.js")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get("http://" + addr + "/outboxes/" + a.Schema + "/")
	require.NoError(t, err)
	page, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(page), `src="ui/app.js"`)
	resp, err = http.Get("http://" + addr + "/outboxes/" + a.Schema + "/ui/app.js")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// The LISTEN session dropped (its backend terminated, as a failover or an
// idle-session killer does): the fleet reconnects and asks every parked
// outbox at once, so a row whose commit notified nobody meanwhile is sent
// without waiting for the reconciliation's pace.
func TestFleetReconcilesEveryOutboxWhenItsListenSessionComesBack(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	p := memory.New(memory.Config{})
	name := "fleet-" + base
	// Neither the reconciliation's pace nor the listing's wakes the fleet
	// in the test's time: the reconnection must.
	session := &sessionRecorder{}
	f, _ := newFleet(t, base+"_t*", p, name, fleet.Options{Reconcile: time.Hour, Discover: time.Hour,
		Session: func(string) fleet.SessionObserver { return session }})
	dbtest.Eventually(t, time.Minute, "both tenants parked", func() bool {
		for _, tbl := range tbls {
			if s, ok := f.Sweeper(tbl); !ok || !s.Parked() {
				return false
			}
		}
		return true
	})
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL session_replication_role = replica"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+tbls[1].Ident()+" (topic, payload) VALUES ('orders', 'silent')")
		return err
	}))
	var killed int
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND query = 'LISTEN outbox_sweeper'`, name).Scan(&killed))
	require.Equal(t, 1, killed, "the fleet's one LISTEN session")
	dbtest.Eventually(t, time.Minute, "the silent row sent after the reconnection", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "silent" })
	})
	// What outbox_listening reads (metrics.Session): up, lost, up again.
	dbtest.Eventually(t, time.Minute, "the session's observer told it was lost and back", func() bool {
		return slices.Equal(session.events(), []string{"up", "down", "up"})
	})
}

// sessionRecorder is a fleet.SessionObserver that keeps what it is told:
// "up", "down", "forget".
type sessionRecorder struct {
	mu   sync.Mutex
	told []string
}

func (r *sessionRecorder) Listening(up bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.told = append(r.told, map[bool]string{true: "up", false: "down"}[up])
}

func (r *sessionRecorder) Forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.told = append(r.told, "forget")
}

func (r *sessionRecorder) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.told)
}

// A dead-letter storm in one tenant trips that tenant's topic and alerts
// under that tenant's name; the other tenant's same topic flows on and no
// alert names it.
func TestFleetStormAlertsNameTheirTenant(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	a, b := tbls[0], tbls[1]
	got := &alerttest.Recorder{}
	p := memory.New(memory.Config{})
	f, _ := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{
		Sweeper: outbox.Config{Alerter: got, DeadLetterLimit: 2, DeadLetterWindow: time.Hour},
	})
	waitParked(t, f, tbls)

	// Five rows of a's mail the broker calls poison, each alone: the third
	// dead letter within the window is a storm.
	w, err := outbox.NewWriter(a)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(context.Background(), dbtest.Pool(t), func(tx pgx.Tx) error {
		for i := range 5 {
			if err := w.Write(context.Background(), tx, outbox.Message{Topic: "mail", Payload: fmt.Appendf(nil, "poison-%d", i)}); err != nil {
				return err
			}
		}
		rows, _ := tx.Query(context.Background(), "SELECT id FROM "+a.Ident())
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		for _, id := range ids {
			p.FailMessage(id, producer.NewMessageError(producer.ReasonInvalidMessage, []int64{id}, errors.New("unparseable")))
		}
		return err
	}))
	sa, _ := f.Sweeper(a)
	dbtest.Eventually(t, time.Minute, "a's mail tripped by the storm guard", func() bool {
		return sa.TopicBreaker().State("mail") == breaker.StateTripped
	})
	dbtest.Eventually(t, time.Minute, "the storm's alert", func() bool { return len(got.Of("dead-letter-storm-guard")) > 0 })
	for _, al := range got.Of("dead-letter-storm-guard") {
		require.Equal(t, a.Schema, al.Outbox, "the storm alert names its tenant: %+v", al)
	}
	require.LessOrEqual(t, deadLetters(t, a), 3, "the guard stopped dead-lettering a's rows")
	require.Equal(t, 5, deadLetters(t, a)+dbtest.Outstanding(t, a), "a's rows are dead-lettered or kept")

	// b's ids start past a's: the memory producer fails a row by its id alone.
	_, err = dbtest.Pool(t).Exec(context.Background(), "SELECT setval(pg_get_serial_sequence($1, 'id'), 1000)", b.Ident())
	require.NoError(t, err)
	write(t, b, outbox.Message{Topic: "mail", Payload: []byte("b-mail")})
	dbtest.Eventually(t, time.Minute, "b's mail delivered", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "b-mail" })
	})
	sb, _ := f.Sweeper(b)
	require.Equal(t, breaker.StateClosed, sb.TopicBreaker().State("mail"))
	for _, al := range got.All() {
		require.NotEqual(t, b.Schema, al.Outbox, "an alert names the healthy tenant: %+v", al)
	}
}

// A tenant whose commits come faster than its sweeps holds its awake lock on
// the fleet's LISTEN session while it sweeps on, so that its commits stop
// notifying (each would take Postgres's cluster-wide notify lock until its
// commit is on disk). The session is killed while it holds the lock: the
// lock goes with it, the fleet listens again, and no row is lost. Once the
// commits stop the lock goes, and a commit notifies and is relayed again.
func TestFleetBusyTenantsCommitsStopNotifying(t *testing.T) {
	p := memory.New(memory.Config{})
	// Eight writers commit a few hundred times a second, fewer on a slow
	// machine under -race: the rate that keeps a pressed tenant awake is set
	// below what they reach anywhere (TestFleetSlowTenantsStayAsleep has the
	// default's).
	busy, holder, count := awakeFleet(t, 2, p, fleet.Options{AwakeRate: 20})
	ctx := context.Background()

	ws := startWriters(t, busy, "busy", 8)
	written := &ws.written

	began := time.Now()
	dbtest.Eventually(t, time.Minute, "busy's awake lock held on the fleet's session", func() bool { return holder() != 0 })
	t.Logf("%.0f commits a second", float64(written.Load())/time.Since(began).Seconds())
	notified, commits := notifiedWhileHeld(t, count, written)
	require.Less(t, notified, commits, "every commit notified while the lock was held")

	// The session that holds the lock ends: the lock with it. The fleet
	// listens again and looks at every outbox; the writers go on.
	pid := holder()
	var ok bool
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok))
	require.True(t, ok)
	dbtest.Eventually(t, time.Minute, "the lock held again, on a new session", func() bool {
		h := holder()
		return h != 0 && h != pid
	})
	ws.stop()
	require.False(t, t.Failed(), "a writer failed")

	dbtest.Eventually(t, time.Minute, "every row relayed", func() bool { return len(distinct(p)) == int(written.Load()) })
	dbtest.Eventually(t, time.Minute, "the lock let go once the commits stopped", func() bool { return holder() == 0 })
	count(nil)
	write(t, busy, outbox.Message{Topic: "orders", Payload: []byte("after")})
	require.Equal(t, 1, count(nil), "a commit notifies again")
	// The producer has a row before its page commits: outstanding until then.
	dbtest.Eventually(t, time.Minute, "the row after relayed, and its page ended", func() bool {
		return distinct(p)["after"] && dbtest.Outstanding(t, busy) == 0
	})
}

// A tenant kept awake by a burst of commits lets its lock go once they slow
// to a steady trickle under half of Options.AwakeRate, though each comes
// within lingerFor (50 ms) of the last: its sweeper would otherwise poll on
// for as long as the trickle lasts. Its commits then notify again, every one.
func TestFleetTenantSlowingDownLetsItsAwakeLockGo(t *testing.T) {
	// The burst's eight writers make a few hundred commits a second (450
	// under -race beside a benchmark), well above 120; the trickle's one
	// commit every 25 ms makes at most 5 in any tenth of a second, 50 a
	// second, under 60, half of 120. A slower machine only slows the
	// trickle. Its gaps are half of lingerFor: before the awake sweeper
	// asked Busy, it let go only when the machine's hiccups made one longer
	// (after 47 s in a run beside a benchmark; here, at once).
	p := memory.New(memory.Config{})
	tbl, holder, count := awakeFleet(t, 1, p, fleet.Options{AwakeRate: 120})

	ws := startWriters(t, tbl, "burst", 8)
	dbtest.Eventually(t, time.Minute, "the awake lock held during the burst", func() bool { return holder() != 0 })

	trickle := make(chan struct{})
	var trickling sync.WaitGroup
	trickling.Go(func() {
		// The writer's pace, not a wait for an event: it is the rate under
		// test.
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-trickle:
				return
			case <-tick.C:
			}
			if !ws.write(t, tbl, fmt.Appendf(nil, "trickle %d", i)) {
				return
			}
		}
	})
	stopTrickle := sync.OnceFunc(func() { close(trickle); trickling.Wait() })
	defer stopTrickle()
	// Stopped once the trickle runs: a gap between the two longer than
	// lingerFor would let the lock go whatever the rate.
	ws.stop()
	// Within a few tenths of a second (a rate is read over a tenth, and the
	// lock goes after lingerFor): 10 s is a bound for a slow machine, not a
	// pace, and shorter than the machine's hiccups took to let it go before.
	dbtest.Eventually(t, 10*time.Second, "the lock let go while the trickle goes on", func() bool { return holder() == 0 })

	// Asleep for good: every commit of 30 in a row notifies (one commit in
	// flight at a time may fall on either side of the first marker). Not
	// necessarily the first 30: a stall of the machine just after the burst
	// (beside CPU hogs, 3 runs in 60) makes the sweeper let go while its
	// rates still read the burst's last tenth of a second, and it takes the
	// lock again until they read the trickle. A lock taken and let go over
	// and over fails every try.
	written := &ws.written
	var notified, from, to int64
	for try := 1; ; try++ {
		count(nil)
		from = written.Load()
		dbtest.Eventually(t, time.Minute, "30 commits of the trickle more", func() bool { return written.Load() >= from+30 })
		notified = int64(count(func() { to = written.Load() }))
		if notified >= to-from-1 || try == 5 {
			t.Logf("try %d: %d of %d commits notified", try, notified, to-from)
			break
		}
	}
	require.GreaterOrEqual(t, notified, to-from-1, "commits of the trickle did not notify: the lock was taken again, in each of 5 tries")
	require.Zero(t, holder(), "the lock taken again during the trickle")
	stopTrickle()
	require.False(t, t.Failed(), "a writer failed")
	dbtest.Eventually(t, time.Minute, "every row relayed", func() bool { return len(distinct(p)) == int(written.Load()) })
}

// A busy tenant behind a slow broker stays awake: each of its sweeps finds
// every commit since the last, and they take longer than a rate read from
// the sweeps that found rows would allow (40 ms a batch: 25 sweeps a second
// at most, under 30, half of Options.AwakeRate's 60). Its rate is read from
// the rows sent; read from the sweeps, it let the lock go after a sweep or
// two and took it again at the next notification, over and over.
func TestFleetBusyTenantBehindASlowBrokerStaysAwake(t *testing.T) {
	p := memory.New(memory.Config{})
	p.SetSendFunc(func(ctx context.Context, _ producer.Batch) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(40 * time.Millisecond): // the broker's pace
			return nil
		}
	})
	tbl, holder, count := awakeFleet(t, 1, p, fleet.Options{AwakeRate: 60})

	ws := startWriters(t, tbl, "busy", 8)
	dbtest.Eventually(t, time.Minute, "the awake lock held", func() bool { return holder() != 0 })
	notified, commits := notifiedWhileHeld(t, count, &ws.written)
	require.Less(t, notified*10, commits, "the lock let go and taken again: %d notifications of %d commits", notified, commits)
	ws.stop()
	require.False(t, t.Failed(), "a writer failed")
	dbtest.Eventually(t, time.Minute, "every row relayed", func() bool { return len(distinct(p)) == int(ws.written.Load()) })
}

// awakeFleet starts a fleet with opts over n new tenants, relaying to p, and
// waits until every sweeper has parked. It returns the first tenant, the pid
// of the fleet's session holding that tenant's awake lock (0 for none), and
// a counter of its notifications (dbtest.Notifications).
func awakeFleet(t *testing.T, n int, p producer.Producer, opts fleet.Options) (outbox.Table, func() int32, func(func()) int) {
	t.Helper()
	base := dbtest.Schema(t)
	tbls := tenants(t, base, n)
	name := "fleet-" + base
	f, _ := newFleet(t, base+"_t*", p, name, opts)
	waitParked(t, f, tbls)
	return tbls[0], func() int32 { return dbtest.AwakeHolder(t, tbls[0], name) }, dbtest.Notifications(t, tbls[0])
}

// notifiedWhileHeld counts, between two markers, the notifications and the
// commits (written) of 200 commits or more. Every commit counted between the
// markers is between them: had each notified, as many notifications at least
// would be.
func notifiedWhileHeld(t *testing.T, count func(func()) int, written *atomic.Int64) (notified, commits int64) {
	t.Helper()
	count(nil)
	from := written.Load()
	dbtest.Eventually(t, time.Minute, "200 commits more", func() bool { return written.Load() >= from+200 })
	var to int64
	notified = int64(count(func() { to = written.Load() }))
	t.Logf("%d notifications of %d commits or more while the lock was held", notified, to-from)
	return notified, to - from
}

// writers commits rows to tbl from n goroutines, one after another each,
// until stop (which waits for them); written counts the commits, and a
// failed write fails t.
type writers struct {
	written atomic.Int64
	stop    func()
}

func startWriters(t *testing.T, tbl outbox.Table, prefix string, n int) *writers {
	t.Helper()
	w := &writers{}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for j := 0; ; j++ {
				select {
				case <-done:
					return
				default:
				}
				if !w.write(t, tbl, fmt.Appendf(nil, "%s %d/%d", prefix, i, j)) {
					return
				}
			}
		})
	}
	w.stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(w.stop)
	return w
}

func (w *writers) write(t *testing.T, tbl outbox.Table, payload []byte) bool {
	wr, err := outbox.NewWriter(tbl)
	if err == nil {
		err = wr.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: "orders", Payload: payload})
	}
	if err != nil {
		t.Errorf("write %s: %v", payload, err)
		return false
	}
	w.written.Add(1)
	return true
}

// A tenant whose commits press its sweeper (two back to back: the second
// notifies during the sweep of the first) but come at 20 a second, below
// Options.AwakeRate, does not keep it awake: each commit notifies, and no
// awake lock is taken. Ten such tenants polling every few milliseconds cost
// a machine of two cores more than their notifications.
func TestFleetSlowTenantsStayAsleep(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 1)
	p := memory.New(memory.Config{})
	name := "fleet-" + base
	f, _ := newFleet(t, base+"_t*", p, name, fleet.Options{})
	waitParked(t, f, tbls)
	for i := range 30 {
		for j := range 2 {
			write(t, tbls[0], outbox.Message{Topic: "orders", Payload: fmt.Appendf(nil, "%d/%d", i, j)})
		}
		require.Zero(t, dbtest.AwakeHolder(t, tbls[0], name), "the awake lock taken at 20 commits a second (pair %d)", i)
		// The writer's pace, not a wait for an event: it bounds the rate at 20
		// commits a second, below AwakeRate on any machine (a slower one only
		// commits more slowly), and the assertion above holds at any rate
		// under it.
		time.Sleep(100 * time.Millisecond)
	}
	dbtest.Eventually(t, time.Minute, "every row relayed", func() bool { return len(distinct(p)) == 60 })
}

// distinct returns the payloads p holds.
func distinct(p *memory.Producer) map[string]bool {
	out := map[string]bool{}
	for _, m := range p.Messages() {
		out[string(m.Payload)] = true
	}
	return out
}

// A tenant dropped while its sweeper is awake (or due to read its cursor
// again, or woken by a commit in flight) is let go at once, and no ERROR
// says to migrate it: its sweep that finds no table has the fleet list the
// schemas again. Before, that sweep logged an ERROR that said to run
// migrate, again at each retry until the next listing (CI, 2026-11-28).
func TestFleetLetsATenantGoWhenItsSweepFindsItDropped(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	a, b := tbls[0], tbls[1]
	p := memory.New(memory.Config{})
	// Listings and reconciliations an hour apart: only the failed sweep
	// can have the fleet look again in time.
	f, l := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Discover: time.Hour, Reconcile: time.Hour})
	dbtest.Eventually(t, time.Minute, "both tenants relayed", func() bool { return len(f.Outboxes()) == 2 })
	// The pass the LISTEN session's first connection asks for: after the
	// drop, its statement would fail and have the fleet list again too.
	dbtest.Eventually(t, time.Minute, "the first reconciliation", func() bool { return f.ReconcilePasses() > 0 })

	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, "DROP SCHEMA "+pgx.Identifier{a.Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	// A notification naming a wakes its sweeper, as a commit in flight
	// would.
	_, err = dbtest.Pool(t).Exec(ctx, "SELECT pg_notify('outbox_sweeper', $1)", a.String())
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "a let go", func() bool { return slices.Equal(f.Outboxes(), []outbox.Table{b}) })
	require.Contains(t, l.String(), "outbox table not found", "a's sweep did not find its table")
	require.NotContains(t, l.String(), "level=ERROR", "the fleet logged errors")

	write(t, b, outbox.Message{Topic: "mail", Payload: []byte("b-mail")})
	dbtest.Eventually(t, time.Minute, "b's mail delivered", func() bool { return distinct(p)["b-mail"] })
}

// A schema whose name the relay does not take (Postgres allows a hyphen or a
// capital; --schema does not) is left out with an ERROR that names it, the
// pattern it matched, and what to do (it named the flag --schema, which the
// fleet was not given), and its commits change nothing. The other tenant
// flows.
func TestFleetLeavesOutASchemaItCannotName(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 1)
	odd := base + "_tX-1"
	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{odd}.Sanitize()+"; CREATE TABLE "+pgx.Identifier{odd, "outbox"}.Sanitize()+" (id bigint)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{odd}.Sanitize()+" CASCADE")
	})
	p := memory.New(memory.Config{})
	f, l := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{Discover: time.Hour, Reconcile: time.Hour})
	dbtest.Eventually(t, time.Minute, "the odd schema left out, the tenant relayed", func() bool {
		return strings.Contains(l.String(), "an outbox is left out") && len(f.Outboxes()) == 1
	})
	require.Contains(t, l.String(), fmt.Sprintf(`schema \"%s\" matches \"%s_t*\", but this relay takes only schema names of lower-case letters`, odd, base))
	require.Contains(t, l.String(), "rename the schema, or narrow the pattern to leave it out")
	require.NotContains(t, l.String(), "--schema", "the message names a flag the fleet was not given")
	require.Equal(t, []outbox.Table{tbls[0]}, f.Outboxes())

	for range 20 {
		_, err := dbtest.Pool(t).Exec(ctx, "SELECT pg_notify('outbox_sweeper', $1)", odd+".outbox")
		require.NoError(t, err)
	}
	// The tenant's row, notified after the odd schema's, is delivered once
	// the fleet has had them all (one LISTEN session, in order).
	write(t, tbls[0], outbox.Message{Topic: "mail", Payload: []byte("mail")})
	dbtest.Eventually(t, time.Minute, "the tenant's mail delivered", func() bool { return distinct(p)["mail"] })
	require.Equal(t, 1, strings.Count(l.String(), "an outbox is left out"), "logged once")
	require.Equal(t, []outbox.Table{tbls[0]}, f.Outboxes())
}

// An outbox at the current schema version whose history table is missing
// (dropped or renamed by hand: migrate would not make it again) is not
// relayed, with one INFO line that says what to do, and is looked at again
// at each listing: once the table is back, it is relayed and its row sent.
func TestFleetRelaysAnOutboxOnceItsHistoryTableIsBack(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	gap := tbls[1]
	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, "ALTER TABLE "+outbox.HistoryIdent(gap)+" RENAME TO "+gap.Name+"_history_away")
	require.NoError(t, err)
	p := memory.New(memory.Config{})
	f, l := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{})
	dbtest.Eventually(t, time.Minute, "the outbox without history left waiting", func() bool {
		return strings.Contains(l.String(), "its schema version is current (dropped by hand?)") && len(f.Outboxes()) == 1
	})
	// The fix it gives: the version set back, then migrate for that schema.
	require.Contains(t, l.String(), strings.ReplaceAll(outbox.VersionIdent(gap), `"`, `\"`)+" SET version = 9)")
	require.Contains(t, l.String(), "sweeper migrate --schemas "+gap.Schema)
	write(t, gap, outbox.Message{Topic: "orders", Payload: []byte("kept")})
	require.Equal(t, []outbox.Table{tbls[0]}, f.Outboxes())

	_, err = dbtest.Pool(t).Exec(ctx, "ALTER TABLE "+pgx.Identifier{gap.Schema, gap.Name + "_history_away"}.Sanitize()+" RENAME TO "+gap.Name+"_history")
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "the outbox relayed once its history is back, its row sent", func() bool {
		return len(f.Outboxes()) == 2 && distinct(p)["kept"]
	})
	require.Equal(t, 1, strings.Count(l.String(), "its schema version is current"), "logged once")
	require.NotContains(t, l.String(), "level=ERROR")
}

// A tenant dropped while Redis does not answer: its sweeper stops all the
// same, and a warning names it, whose trips stay in Redis (they close
// after their cooldowns); nothing else of the fleet waits for Redis.
func TestFleetSaysWhichDroppedTenantsTripsStayInRedis(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	a := tbls[0]
	url, stop, _ := brokertest.StartRedis(t)
	client := brokertest.RedisClient(t, url)
	f, l := newFleet(t, base+"_t*", memory.New(memory.Config{}), "fleet-"+base, fleet.Options{
		TopicBreaker: func(_ outbox.Table, name string, _ *slog.Logger) (breaker.Breaker, error) {
			return breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: "forget:" + name, Instance: base})
		},
	})
	dbtest.Eventually(t, time.Minute, "both tenants relayed", func() bool { return len(f.Outboxes()) == 2 })
	stop()
	_, err := dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{a.Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "a let go", func() bool { return slices.Equal(f.Outboxes(), tbls[1:]) })
	dbtest.Eventually(t, time.Minute, "the warning naming a", func() bool {
		return strings.Contains(l.String(), "stays in Redis") && strings.Contains(l.String(), "outboxes="+a.Schema)
	})
}

// A tenant whose topic breaker is shared through Redis leaves with its
// breaker when its schema is dropped: the fleet no longer looks at it every
// second nor keeps its state for the life of the process, deletes its state
// from Redis (a schema made again under its name starts afresh, not with its
// trips), logs no error for it, and the other tenant's breaker stays
// shared, its trip kept, its rows flowing.
func TestFleetLetsADroppedTenantsSharedBreakerGo(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	a, b := tbls[0], tbls[1]
	client := brokertest.RedisClient(t, brokertest.RedisURL(t))
	prefix := brokertest.RedisPrefix(t, client, "outbox-fleet-test")
	p := memory.New(memory.Config{})
	shared := func(name string) (breaker.Breaker, error) {
		return breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: prefix + ":" + name, Instance: base,
			Settings: breaker.Settings{CooldownTicks: 100000, MaxCooldownTicks: 100000}}) // trips outlast the test
	}
	// b's orders is tripped in Redis before the fleet starts, as by another
	// instance: every plan of b's sweeper sees it. (A trip another instance
	// makes holds from each sweep's next plan; one made through b's own
	// breaker, at once.) a's too: its state is deleted once a is gone.
	for _, tbl := range tbls {
		other, err := shared(tbl.Schema)
		require.NoError(t, err)
		other.Trip("orders", "by the test")
	}
	keysOf := func(tbl outbox.Table) []string {
		keys, err := client.Keys(context.Background(), prefix+":"+tbl.Schema+":*").Result()
		require.NoError(t, err)
		slices.Sort(keys)
		return keys
	}
	require.Contains(t, keysOf(a), prefix+":"+a.Schema+":topics")
	f, l := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.Options{
		TopicBreaker: func(_ outbox.Table, name string, _ *slog.Logger) (breaker.Breaker, error) { return shared(name) },
	})
	dbtest.Eventually(t, time.Minute, "both tenants relayed", func() bool { return len(f.Outboxes()) == 2 })
	require.Equal(t, []string{a.String(), b.String()}, f.SharedBreakers())
	sb, _ := f.Sweeper(b)
	require.Equal(t, breaker.StateTripped, sb.TopicBreaker().State("orders"), "b's breaker reads the trip from Redis")
	write(t, a, outbox.Message{Topic: "mail", Payload: []byte("a-mail")})
	dbtest.Eventually(t, time.Minute, "a's mail delivered", func() bool { return distinct(p)["a-mail"] })

	_, err := dbtest.Pool(t).Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{a.Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "a let go", func() bool { return slices.Equal(f.Outboxes(), []outbox.Table{b}) })
	require.Equal(t, []string{b.String()}, f.SharedBreakers(), "a's breaker left with it")
	// Its state in Redis with it, but the generations' sequence; b's kept.
	dbtest.Eventually(t, time.Minute, "a's state deleted from Redis", func() bool {
		return slices.Equal(keysOf(a), []string{prefix + ":" + a.Schema + ":genseq"})
	})
	require.Contains(t, keysOf(b), prefix+":"+b.Schema+":topics")

	write(t, b, outbox.Message{Topic: "orders", Payload: []byte("b-orders")}, outbox.Message{Topic: "mail", Payload: []byte("b-mail")})
	dbtest.Eventually(t, time.Minute, "b's mail delivered", func() bool { return distinct(p)["b-mail"] })
	// A sweep's topics go out side by side: a row written after the mail
	// arrived is sent by a later sweep, one that began after the first
	// ended, so by then a lost trip would have sent the orders row.
	write(t, b, outbox.Message{Topic: "mail", Payload: []byte("b-mail-2")})
	dbtest.Eventually(t, time.Minute, "b's second mail delivered and moved out", func() bool {
		return distinct(p)["b-mail-2"] && dbtest.Outstanding(t, b) == 1
	})
	require.False(t, distinct(p)["b-orders"], "b's tripped topic sent")
	onRedis := sb.TopicBreaker().(interface{ Degraded() bool })
	require.False(t, onRedis.Degraded(), "b's breaker on its local state, not Redis's")
	require.Equal(t, breaker.StateTripped, sb.TopicBreaker().State("orders"), "b's trip is kept in Redis")

	// a made again under its name starts afresh: its orders flow.
	require.NoError(t, migrate(dbtest.URL(t), a))
	dbtest.Eventually(t, time.Minute, "a relayed again", func() bool { return len(f.Outboxes()) == 2 })
	write(t, a, outbox.Message{Topic: "orders", Payload: []byte("a-orders")})
	dbtest.Eventually(t, time.Minute, "the new a's orders delivered", func() bool { return distinct(p)["a-orders"] })
	require.NotContains(t, l.String(), "level=ERROR", "the fleet logged errors")
	require.NotContains(t, l.String(), "stays in Redis", "the fleet could not delete a's state")
}

// Options.Logger left nil defaults to discarding, the admin API's included:
// it was copied to the admin's while still nil, and the first listing of the
// outboxes (a scrape, GET /outboxes) panicked.
func TestFleetWithoutALoggerListsItsOutboxes(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 1)
	f, err := fleet.New(dbtest.NamedPool(t, "fleet-"+base), memory.New(memory.Config{}), fleet.Options{Schemas: base + "_t*",
		Discover: 200 * time.Millisecond, Probe: outbox.ProbeConfig{Alerter: alert.Log{Logger: slog.New(slog.DiscardHandler)}}})
	require.NoError(t, err)
	start(t, f)
	dbtest.Eventually(t, time.Minute, "the tenant found", func() bool { return len(f.Outboxes()) == 1 })
	states := f.States()
	require.Len(t, states, 1)
	backlogs, err := f.Backlogs(context.Background(), []string{tbls[0].Schema})
	require.NoError(t, err)
	require.Contains(t, backlogs, tbls[0].Schema)
}

// A tenant whose table DDL holds (VACUUM FULL, LOCK TABLE, an ALTER under
// way) does not hold the database's only turn: its listing gives up on the
// lock, and another tenant's row goes. It waited for as long as the lock
// lasted, and every tenant with it.
func TestFleetALockedTenantDoesNotHoldTheTurn(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	locked, other := tbls[0], tbls[1]
	name := "fleet-" + base
	cfg, err := pgxpool.ParseConfig(dbtest.NamedURL(t, dbtest.URL(t), name))
	require.NoError(t, err)
	cfg.MaxConns = 3 // one turn
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	p := memory.New(memory.Config{})
	f, logs := newFleetOn(t, pool, base+"_t*", p, fleet.Options{Reconcile: time.Hour})
	dbtest.Eventually(t, time.Minute, "both tenants relayed", func() bool { return len(f.Outboxes()) == 2 })
	waitParked(t, f, tbls)

	ctx := context.Background()
	defer dbtest.LockTables(t, locked.Ident())()
	_, err = dbtest.Pool(t).Exec(ctx, "SELECT pg_notify('outbox_sweeper', $1)", locked.Schema+"."+locked.Name)
	require.NoError(t, err)
	dbtest.Eventually(t, time.Minute, "the locked tenant's sweep waiting on its lock", func() bool {
		var n int
		require.NoError(t, dbtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
			name).Scan(&n))
		return n > 0
	})

	write(t, other, outbox.Message{Topic: "orders", Payload: []byte("goes")})
	dbtest.Eventually(t, time.Minute, "the other tenant's row delivered", func() bool { return len(p.Messages()) == 1 })
	dbtest.Eventually(t, time.Minute, "the locked tenant's sweep failing on the lock, logged", func() bool {
		return strings.Contains(logs.String(), "lock timeout")
	})
}

// An outbox whose reconciliation ask fails every time (here a column it
// reads renamed by hand) does not keep its neighbours from being answered:
// asked in one statement with it, they failed with it at every pass, and a
// row of theirs whose commit notified nobody waited for good.
func TestFleetAFailingAskLeavesItsNeighboursAnswered(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 3)
	broken, kept := tbls[0], tbls[2] // in one chunk
	p := memory.New(memory.Config{})
	f, l := newFleet(t, base+"_t*", p, "fleet-"+base, fleet.WithoutSlices(fleet.Options{Reconcile: 100 * time.Millisecond}))
	waitParked(t, f, tbls)
	passedParked(t, f)
	_, err := dbtest.Pool(t).Exec(context.Background(), "ALTER TABLE "+broken.Ident()+" RENAME COLUMN dispatched_at TO gone")
	require.NoError(t, err)
	// One transaction, so that one pass finds both counts moved and asks
	// both at once.
	silently(t, "kept", "", broken, kept)
	dbtest.Eventually(t, time.Minute, "the kept outbox's row delivered", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "kept" })
	})
	dbtest.Eventually(t, time.Minute, "the broken outbox's ask failing, named", func() bool {
		return strings.Contains(l.String(), "ask "+broken.String())
	})
}

// One tenant whose table DDL holds does not hold up the maintenance of the
// others: its turn ends by its bound and the next tenant's retention runs
// (its old dead letter deleted). It waited for as long as the lock lasted,
// every tenant after it unmaintained.
func TestFleetALockedTenantDoesNotHoldUpTheOthersMaintenance(t *testing.T) {
	base := dbtest.Schema(t)
	tbls := tenants(t, base, 2)
	locked, other := tbls[0], tbls[1] // in this order: idle tenants by name
	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, "INSERT INTO "+other.DeadLetterIdent()+
		" (id, message_id, topic, payload, created_at, reason, dead_lettered_at) VALUES (1, gen_random_uuid(), 'orders', 'x', now(), 'invalid_message', now() - interval '2 hours')")
	require.NoError(t, err)
	defer dbtest.LockTables(t, locked.Ident(), locked.DeadLetterIdent())()

	_, logs := newFleet(t, base+"_t*", memory.New(memory.Config{}), "fleet-"+base, fleet.MaintainEach(fleet.Options{
		Reconcile: time.Hour, Maintenance: 100 * time.Millisecond, IdleMaintenance: 100 * time.Millisecond,
		Retention: outbox.RetentionConfig{DeadLetters: time.Hour},
	}, time.Second))
	dbtest.Eventually(t, time.Minute, "the other tenant's old dead letter deleted by its retention", func() bool {
		return deadLetters(t, other) == 0
	})
	// Logged when the round returns, after the other tenant's delete.
	dbtest.Eventually(t, time.Minute, "the locked tenant's turn ended on its bound, logged", func() bool {
		return strings.Contains(logs.String(), "retention of "+locked.String())
	})
}
