package test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// arrivals records when each message id reached a consumer, and how often.
type arrivals struct {
	mu    sync.Mutex
	at    map[string]time.Time
	count map[string]int
}

func newArrivals() *arrivals {
	return &arrivals{at: map[string]time.Time{}, count: map[string]int{}}
}

func (a *arrivals) add(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.at[id]; !ok {
		a.at[id] = time.Now()
	}
	a.count[id]++
}

func (a *arrivals) has(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.count[id] > 0
}

func (a *arrivals) duplicates() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for id, n := range a.count {
		if n > 1 {
			out = append(out, id)
		}
	}
	return out
}

// healthyWriter writes one row of topic every interval until stopped, and keeps
// when each committed, by message id.
type healthyWriter struct {
	mu      sync.Mutex
	written map[string]time.Time
	stop    chan struct{}
	done    chan struct{}
}

func writeHealthy(t *testing.T, tbl outbox.Table, topic string, every time.Duration) *healthyWriter {
	t.Helper()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	h := &healthyWriter{written: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-h.stop:
				return
			case <-tick.C:
			}
			id := uuid.NewString()
			err := w.Write(context.Background(), dbtest.Pool(t), outbox.Message{Topic: topic, MessageID: id,
				Payload: fmt.Appendf(nil, "healthy-%d", i), CorrelationID: fmt.Sprintf("healthy-%d", i)})
			if err != nil {
				t.Errorf("write a healthy row: %v", err)
				return
			}
			h.mu.Lock()
			h.written[id] = time.Now()
			h.mu.Unlock()
		}
	}()
	t.Cleanup(h.halt)
	return h
}

func (h *healthyWriter) writtenCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.written)
}

func (h *healthyWriter) halt() {
	select {
	case <-h.stop:
	default:
		close(h.stop)
	}
	<-h.done
}

// latencies returns, once every written row has arrived, each one's time from
// its commit to its arrival, sorted.
func (h *healthyWriter) latencies(a *arrivals) []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]time.Duration, 0, len(h.written))
	for id, w := range h.written {
		out = append(out, a.at[id].Sub(w))
	}
	slices.Sort(out)
	return out
}

func (h *healthyWriter) allArrived(a *arrivals) bool {
	h.mu.Lock()
	ids := make([]string, 0, len(h.written))
	for id := range h.written {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		if !a.has(id) {
			return false
		}
	}
	return len(ids) > 0
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[(len(d)*99+99)/100-1]
}

// deadLetterReasons returns the dead letters of tbl by id: their reason and
// error.
func deadLetterReasons(t *testing.T, tbl outbox.Table) map[int64][2]string {
	t.Helper()
	rows, err := dbtest.Pool(t).Query(context.Background(), "SELECT id, reason, coalesce(error, '') FROM "+
		pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize())
	require.NoError(t, err)
	out := map[int64][2]string{}
	var id int64
	var reason, text string
	_, err = pgx.ForEachRow(rows, []any{&id, &reason, &text}, func() error { out[id] = [2]string{reason, text}; return nil })
	require.NoError(t, err)
	return out
}

// writeOne writes m and returns its row id. The id is read in the writing
// transaction: once it commits, a sweeper woken by the commit may move the row
// to the dead-letter table before a later query could find it.
func writeOne(t *testing.T, tbl outbox.Table, m outbox.Message) int64 {
	t.Helper()
	if m.MessageID == "" {
		m.MessageID = uuid.NewString()
	}
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	ctx := context.Background()
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error {
		if err := w.Write(ctx, tx, m); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT id FROM "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+" WHERE message_id = $1", m.MessageID).Scan(&id)
	}))
	return id
}

type poisonRow struct {
	name string
	msg  outbox.Message
	// deadLettered: the row is dead-lettered with reason invalid_message and
	// an error naming the limit; otherwise its topic is refused (topic class)
	// and the row waits, untouched, with the reason in last_error.
	deadLettered bool
	reason       string // the dead-letter reason; empty: invalid_message
	limit        string // a word the error must hold
}

// poisonRun runs the binary with args while a healthy topic gets a row every
// 100 ms, writes the poison rows with good neighbours in a mixed topic, and
// checks: every healthy row arrives once, and nothing held it up (no batch of
// it failed, no failure was put on the broker, no sweep failed, the broker
// breaker never opened; and p99 of commit to arrival stays under 10s, below
// the 15s send timeout a hung send would cost); the mixed topic's good rows
// arrive once; each poison row is dead-lettered with the right reason, or its
// topic refused with its rows untouched; the process never dies.
func poisonRun(t *testing.T, tbl outbox.Table, args []string, healthy, mixed string, poison []poisonRow, got *arrivals) {
	t.Helper()
	p := start(t, nil, append(args, "--log-format", "json")...)
	h := writeHealthy(t, tbl, healthy, 100*time.Millisecond)
	dbtest.Eventually(t, 2*time.Minute, "the first healthy rows", func() bool { return h.allArrived(got) })

	var goodIDs []string
	dead, waiting := map[int64]poisonRow{}, map[int64]poisonRow{}
	for i, pr := range poison {
		good := uuid.NewString()
		goodIDs = append(goodIDs, good)
		writeOne(t, tbl, outbox.Message{Topic: mixed, MessageID: good, Payload: fmt.Appendf(nil, "good-%d", i)})
		id := writeOne(t, tbl, pr.msg)
		if pr.deadLettered {
			dead[id] = pr
		} else {
			waiting[id] = pr
		}
	}
	last := uuid.NewString()
	goodIDs = append(goodIDs, last)
	writeOne(t, tbl, outbox.Message{Topic: mixed, MessageID: last, Payload: []byte("good-last")})

	dbtest.Eventually(t, 3*time.Minute, "the poison rows handled and the good ones delivered", func() bool {
		for _, id := range goodIDs {
			if !got.has(id) {
				return false
			}
		}
		return len(deadLetterReasons(t, tbl)) >= len(dead)
	})
	// Thirty more healthy rows after the poison, then every healthy row must
	// have arrived.
	after := h.writtenCount() + 30
	dbtest.Eventually(t, 2*time.Minute, "thirty more healthy rows written", func() bool { return h.writtenCount() >= after })
	h.halt()
	dbtest.Eventually(t, 2*time.Minute, "every healthy row", func() bool { return h.allArrived(got) })
	lat := h.latencies(got)
	// How long a row takes depends on the machine (the worst of 40 rows,
	// under a CPU hog, came near 0.75s), so the bound is only the backstop
	// for a stall of a send timeout; what would hold the healthy topic up for
	// less is in the log, checked below.
	require.Less(t, p99(lat), 10*time.Second, "p99 of the healthy topic's commit-to-arrival over %d rows (max %s)", len(lat), lat[len(lat)-1])

	dls := deadLetterReasons(t, tbl)
	for id, pr := range dead {
		d, ok := dls[id]
		require.True(t, ok, "%s (row %d) was not dead-lettered; stderr:\n%s", pr.name, id, p.Stderr())
		require.Equal(t, cmp.Or(pr.reason, "invalid_message"), d[0], "%s: %s", pr.name, d[1])
		require.Contains(t, d[1], pr.limit, "%s: the error names the limit", pr.name)
	}
	require.Len(t, dls, len(dead), "only the poison rows were dead-lettered")
	for id, pr := range waiting {
		var attempts int
		var lastError *string
		require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT attempts, last_error FROM "+
			pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+" WHERE id = $1 AND dispatched_at IS NULL", id).Scan(&attempts, &lastError))
		require.Zero(t, attempts, "%s: a refused topic charges no row", pr.name)
		require.NotNil(t, lastError, "%s waits with its reason", pr.name)
		require.Contains(t, *lastError, pr.limit, pr.name)
	}
	require.Empty(t, got.duplicates(), "nothing delivered twice because of the poison")

	select {
	case <-p.done:
		t.Fatalf("the sweeper died (exit %d); stderr:\n%s", p.code, p.Stderr())
	default:
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.Stderr())
	require.NotContains(t, p.Stderr(), "panic")
	require.NotContains(t, p.Stderr(), "broker circuit breaker open", "the poison never looked like an outage")
	failures := 0
	for _, line := range strings.Split(strings.TrimSpace(p.Stderr()), "\n") {
		var l struct{ Msg, Topic, Class string }
		require.NoError(t, json.Unmarshal([]byte(line), &l), "a log line that is not JSON: %q", line)
		if l.Class != "" {
			failures++
		}
		require.NotEqual(t, "sweep failed; retrying", l.Msg, "a sweep failed: %s", line)
		require.False(t, l.Topic == healthy && l.Class != "", "a batch of the healthy topic failed: %s", line)
		require.NotEqual(t, "broker", l.Class, "a failure put on the broker: the poison looked like an outage: %s", line)
	}
	require.Positive(t, failures, "the poison's failures are logged, with their class")
	t.Logf("healthy: %d rows, p50 %s, p99 %s, max %s; %d failed batches logged, none of the healthy topic or the broker",
		len(lat), lat[len(lat)/2], p99(lat), lat[len(lat)-1], failures)
}

// Rows the AMQP client would refuse, or that would break the shared
// connection, beside a healthy topic: they are caught before the send, so the
// broker breaker never opens, the healthy rows keep their latency and nothing
// is delivered twice.
func TestPoisonRowsOnRabbitMQNeverStallTheHealthyTopic(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_poison")
	healthy, mixed := "poison.healthy", "poison.mixed"
	long := strings.Repeat("k", 300)
	got := newArrivals()
	consumeAMQP(t, url, exchange, []string{healthy, mixed}, got)
	tbl := migrated(t)
	poison := []poisonRow{
		{name: "routing key of 300 bytes", msg: outbox.Message{Topic: strings.Repeat("r", 300), Payload: []byte("x")}, limit: "255"},
		{name: "correlation_id of 300 bytes", msg: outbox.Message{Topic: mixed, Payload: []byte("x"), CorrelationID: long}, deadLettered: true, limit: "255"},
		{name: "content_type of 300 bytes", msg: outbox.Message{Topic: mixed, Payload: []byte("x"), ContentType: long}, deadLettered: true, limit: "255"},
		{name: "header key of 300 bytes", msg: outbox.Message{Topic: mixed, Payload: []byte("x"), Headers: map[string]any{long: "v"}}, deadLettered: true, limit: "255"},
		{name: "header value of 1 MB", msg: outbox.Message{Topic: mixed, Payload: []byte("x"), Headers: map[string]any{"big": strings.Repeat("v", 1<<20)}}, deadLettered: true, reason: "message_too_large", limit: "frame"},
	}
	poisonRun(t, tbl, rabbitArgs(t, tbl, url, exchange, "--tick", "200ms", "--max-attempts", "3"), healthy, mixed, poison, got)
}

// consumeAMQP binds a queue per routing key on exchange and records arrivals
// by message id.
func consumeAMQP(t *testing.T, url, exchange string, keys []string, got *arrivals) {
	t.Helper()
	ch := brokertest.RabbitMQExchange(t, url, exchange)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	for _, k := range keys {
		require.NoError(t, ch.QueueBind(q.Name, k, exchange, false, nil))
	}
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	go func() {
		for d := range deliveries {
			got.add(d.MessageId)
		}
	}()
}

// The same on NATS: subjects the server would refuse or that would drop the
// connection (a space, 10,000 characters), and header names NATS cannot carry.
func TestPoisonRowsOnNATSNeverStallTheHealthyTopic(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	prefix := brokertest.Name("poison")
	healthy, mixed := prefix+".healthy", prefix+".mixed"
	nc, _ := brokertest.PrefixStream(t, url, prefix)
	got := newArrivals()
	sub, err := nc.Subscribe(prefix+".>", func(m *natsgo.Msg) { got.add(m.Header.Get("Nats-Msg-Id")) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())

	tbl := migrated(t)
	poison := []poisonRow{
		{name: "subject with a space", msg: outbox.Message{Topic: prefix + ".has space", Payload: []byte("x")}, limit: "subject"},
		{name: "subject of 10,000 characters", msg: outbox.Message{Topic: prefix + "." + strings.Repeat("s", 10_000), Payload: []byte("x")}, limit: "subject"},
		{name: "header key with a space", msg: outbox.Message{Topic: mixed, Payload: []byte("x"), Headers: map[string]any{"bad key": "v"}}, deadLettered: true, limit: "header"},
		{name: "header key with a colon", msg: outbox.Message{Topic: mixed, Payload: []byte("x"), Headers: map[string]any{"bad:key": "v"}}, deadLettered: true, limit: "header"},
	}
	args := []string{"run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--producer", "nats", "--nats-url", url,
		"--tick", "200ms", "--max-attempts", "3"}
	poisonRun(t, tbl, args, healthy, mixed, poison, got)
}

// outage is how long the broker stays down in the outage tests: five minutes,
// as the issue asks; OUTBOX_TEST_OUTAGE shortens it for a quick local run.
func outage(t *testing.T) time.Duration {
	if v := os.Getenv("OUTBOX_TEST_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "OUTBOX_TEST_OUTAGE")
		return d
	}
	return 5 * time.Minute
}

// A broker that is really down (refusing connections) or hangs (accepting them
// and saying nothing) for minutes, one topic, --max-attempts 3: nothing is
// dead-lettered, no row counts an attempt, and everything written before,
// during and after arrives once it is back.
func TestLongBrokerOutageChargesNoRow(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"refusing", "hanging"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			url := brokertest.RabbitMQURL(t)
			exchange := brokertest.Name("outbox_outage")
			topic := "outage." + mode
			got := newArrivals()
			consumeAMQP(t, url, exchange, []string{topic}, got)
			proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
			tbl := migrated(t)
			p := start(t, nil, rabbitArgs(t, tbl, brokertest.WithHost(t, url, proxy.Addr()), exchange,
				"--tick", "200ms", "--max-attempts", "3", "--send-timeout", "2s", "--breaker-open-duration", "5s")...)

			var ids []string
			write := func() {
				id := uuid.NewString()
				writeOne(t, tbl, outbox.Message{Topic: topic, MessageID: id, Payload: []byte(id)})
				ids = append(ids, id)
			}
			write()
			dbtest.Eventually(t, 2*time.Minute, "the first row", func() bool { return got.has(ids[0]) })

			if mode == "refusing" {
				proxy.Refuse(true)
			} else {
				proxy.Hang(true)
			}
			proxy.Cut()
			end := time.Now().Add(outage(t))
			for time.Now().Before(end) {
				write()
				var attempts, dead int
				require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT coalesce(sum(attempts), 0) FROM "+
					dbtest.EveryRow(tbl)).Scan(&attempts))
				require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT count(*) FROM "+
					pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()).Scan(&dead))
				require.Zero(t, attempts, "no row charged for the broker's outage")
				require.Zero(t, dead, "nothing dead-lettered during the outage")
				time.Sleep(time.Second) // paces the writes during the outage; the loop ends on the clock by design (the outage's length), not on an event
			}
			// The sweeper met the outage (a sender that hung past its
			// timeout, or was never refused, would pass the checks above):
			// its broker breaker opened on the failed sends.
			dbtest.Eventually(t, 2*time.Minute, "the broker breaker open on the outage", func() bool {
				return strings.Contains(p.Stderr(), "broker circuit breaker open")
			})
			proxy.Refuse(false)
			proxy.Hang(false)
			proxy.Cut() // the hung connections
			write()
			dbtest.Eventually(t, 3*time.Minute, "every row delivered after the outage", func() bool {
				for _, id := range ids {
					if !got.has(id) {
						return false
					}
				}
				return true
			})
			// The dispatched mark commits a moment after the broker took the batch.
			dbtest.Eventually(t, time.Minute, "every row marked dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
			require.Empty(t, deadLetterReasons(t, tbl))
			require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
			require.Equal(t, 0, p.wait(t, time.Minute), p.Stderr())
			t.Logf("%s broker for %s: %d rows, all delivered, none charged", mode, outage(t), len(ids))
		})
	}
}
