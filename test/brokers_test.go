package test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// received is a message as a consumer saw it, reduced to what the round-trip
// tests compare.
type received struct {
	topic         string
	messageID     string
	correlationID string
	seq           float64 // the "seq" header
	payload       string
}

// writeRoundTrip writes n rows over topics, interleaved, each with a seq header,
// a correlation id and a payload naming its topic and sequence, and returns the
// rows' message ids by id.
func writeRoundTrip(t *testing.T, tbl outbox.Table, topics []string, n int) map[int64]string {
	t.Helper()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	for start := 0; start < n; start += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for i := start; i < min(start+1000, n); i++ {
			topic := topics[i%len(topics)]
			msgs = append(msgs, outbox.Message{
				Topic:         topic,
				Payload:       fmt.Appendf(nil, "%s/%d", topic, i),
				Headers:       map[string]any{"seq": i, "source": "round-trip"},
				CorrelationID: fmt.Sprintf("corr-%d", i),
			})
		}
		require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), msgs...))
	}
	rows, err := dbtest.Pool(t).Query(context.Background(),
		"SELECT id, message_id::text FROM "+dbtest.EveryRow(tbl))
	require.NoError(t, err)
	ids := map[int64]string{}
	var id int64
	var mid string
	_, err = pgx.ForEachRow(rows, []any{&id, &mid}, func() error { ids[id] = mid; return nil })
	require.NoError(t, err)
	require.Len(t, ids, n)
	return ids
}

// checkRoundTrip checks that every row arrived once, in id order per topic, with
// its message id, correlation id and headers intact.
func checkRoundTrip(t *testing.T, got map[string][]received, ids map[int64]string, topics []string, n int) {
	t.Helper()
	byMessageID := map[string]bool{}
	total := 0
	for _, topic := range topics {
		msgs := got[topic]
		require.Len(t, msgs, n/len(topics), "topic %s", topic)
		last := -1.0
		for _, m := range msgs {
			require.False(t, byMessageID[m.messageID], "message %s received twice", m.messageID)
			byMessageID[m.messageID] = true
			require.Greater(t, m.seq, last, "topic %s out of order", topic)
			last = m.seq
			require.Equal(t, fmt.Sprintf("corr-%d", int(m.seq)), m.correlationID)
			require.Equal(t, fmt.Sprintf("%s/%d", topic, int(m.seq)), m.payload)
			total++
		}
	}
	require.Equal(t, n, total)
	for id, mid := range ids {
		require.True(t, byMessageID[mid], "row %d (message %s) never arrived", id, mid)
	}
}

func topicNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s.topic-%d", prefix, i)
	}
	return out
}

// rabbitConsumers binds a queue per topic on exchange and collects deliveries.
type rabbitConsumers struct {
	mu      sync.Mutex
	got     map[string][]received
	dups    int
	url     string
	exch    string
	topics  []string
	markers map[string]int // markers received, by topic: see drain
}

func consumeRabbitMQ(t *testing.T, url, exchange string, topics []string) *rabbitConsumers {
	t.Helper()
	ch := brokertest.RabbitMQExchange(t, url, exchange)
	rc := &rabbitConsumers{got: map[string][]received{}, url: url, exch: exchange, topics: topics, markers: map[string]int{}}
	for _, topic := range topics {
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.QueueBind(q.Name, topic, exchange, false, nil))
		deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
		require.NoError(t, err)
		go func() {
			for d := range deliveries {
				if d.Headers["source"] == markerSource {
					rc.mu.Lock()
					rc.markers[topic]++
					rc.mu.Unlock()
					continue
				}
				seq, _ := d.Headers["seq"].(int64)
				if d.Headers["source"] != "round-trip" {
					seq = -1 // checkRoundTrip fails on it: a header was lost
				}
				rc.mu.Lock()
				rc.got[topic] = append(rc.got[topic], received{topic: topic, messageID: d.MessageId,
					correlationID: d.CorrelationId, seq: float64(seq), payload: string(d.Body)})
				rc.mu.Unlock()
			}
		}()
	}
	return rc
}

// markerSource is the "source" header of the markers drain publishes.
const markerSource = "test-marker"

// drain returns once every message the broker had queued for the consumers
// when it was called has been received: it publishes a marker on each topic,
// behind everything already in its queue, and waits for the markers to come
// back. Call it once the senders are done, before looking for duplicates:
// nothing the broker took from them can arrive after it.
func (rc *rabbitConsumers) drain(t *testing.T) {
	t.Helper()
	rc.mu.Lock()
	want := map[string]int{}
	for _, topic := range rc.topics {
		want[topic] = rc.markers[topic] + 1
	}
	rc.mu.Unlock()
	conn, err := amqp.Dial(rc.url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	for _, topic := range rc.topics {
		dc, err := ch.PublishWithDeferredConfirm(rc.exch, topic, true, false,
			amqp.Publishing{Headers: amqp.Table{"source": markerSource}, Body: []byte("marker")})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		acked, err := dc.WaitContext(ctx)
		cancel()
		require.NoError(t, err)
		require.True(t, acked, "the broker refused a marker")
	}
	dbtest.Eventually(t, time.Minute, "the markers behind every queued message", func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		for topic, n := range want {
			if rc.markers[topic] < n {
				return false
			}
		}
		return true
	})
}

func (rc *rabbitConsumers) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	n := 0
	for _, m := range rc.got {
		n += len(m)
	}
	return n
}

// distinct counts the different message ids received: redeliveries after a
// failure push count past the rows while some are still on their way.
func (rc *rabbitConsumers) distinct() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	seen := map[string]bool{}
	for _, msgs := range rc.got {
		for _, m := range msgs {
			seen[m.messageID] = true
		}
	}
	return len(seen)
}

func (rc *rabbitConsumers) snapshot() map[string][]received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := map[string][]received{}
	for k, v := range rc.got {
		out[k] = append([]received(nil), v...)
	}
	return out
}

// runSweeper runs an in-process sweeper relaying tbl to p until stop is called,
// which also closes p.
func runSweeper(t *testing.T, tbl outbox.Table, p producer.Producer) (stop func()) {
	t.Helper()
	s, err := outbox.NewSweeper(dbtest.Pool(t), p, outbox.Config{Table: tbl, Tick: 10 * time.Millisecond})
	require.NoError(t, err)
	stopRun := dbtest.RunSweeper(t, s)
	return func() {
		stopRun()
		require.NoError(t, p.Close(context.Background()))
	}
}

func TestRoundTripRabbitMQ(t *testing.T) {
	t.Parallel()
	const n = 10_000
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_rt")
	topics := topicNames("orders", 10)
	rc := consumeRabbitMQ(t, url, exchange, topics)

	tbl := migrated(t)
	ids := writeRoundTrip(t, tbl, topics, n)
	p, err := rabbitmq.New(rabbitmq.Config{URL: url, Exchange: exchange})
	require.NoError(t, err)
	stop := runSweeper(t, tbl, p)
	dbtest.Eventually(t, 3*time.Minute, "every message consumed", func() bool { return rc.count() >= n })
	stop()
	require.Zero(t, dbtest.Outstanding(t, tbl))
	rc.drain(t) // a duplicate still on its way would show now
	checkRoundTrip(t, rc.snapshot(), ids, topics, n)
}

// A topic no queue is bound to fails as topic-class through the whole relay:
// its rows stay outstanding with the reason, none charged or dead-lettered,
// the other topics are delivered; once a queue is bound, every one of its
// rows arrives.
func TestRabbitMQUnroutableTopicThroughTheSweeper(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_unroutable")
	rc := consumeRabbitMQ(t, url, exchange, []string{"bound"})
	tbl := migrated(t)
	insertRows(t, tbl, "bound", 20)
	insertRows(t, tbl, "unbound", 5)
	p, err := rabbitmq.New(rabbitmq.Config{URL: url, Exchange: exchange})
	require.NoError(t, err)
	s, err := outbox.NewSweeper(dbtest.Pool(t), p, outbox.Config{Table: tbl})
	require.NoError(t, err)
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 20, res.Dispatched)
	require.Equal(t, []string{"unbound"}, res.FailedTopics)
	var lastError string
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(),
		"SELECT last_error FROM "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()+" WHERE topic = 'unbound' ORDER BY id LIMIT 1").Scan(&lastError))
	require.Contains(t, lastError, "topic failure (unroutable)")
	dbtest.Eventually(t, time.Minute, "20 messages", func() bool { return rc.count() >= 20 })
	require.Equal(t, 5, dbtest.Outstanding(t, tbl), "the unroutable topic's rows wait")
	requireNothingCharged(t, tbl)

	// The queue the application forgot, bound: the topic's trial, once its
	// cooldown's ticks have passed (a Sweep is a tick), delivers every row.
	late := consumeRabbitMQ(t, url, exchange, []string{"unbound"})
	dbtest.Eventually(t, time.Minute, "the unbound topic's 5 rows, once bound", func() bool {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
		return late.count() >= 5
	})
	require.Zero(t, dbtest.Outstanding(t, tbl))
	require.Empty(t, deadLetterReasons(t, tbl))
	require.NoError(t, p.Close(context.Background()))
}

// The connection to RabbitMQ is cut again and again while the sweeper relays:
// every row arrives at least once, none is lost. The cuts come from the sends
// themselves, every fifth one cutting while it publishes, so each falls in the
// middle of the run whatever the machine's pace.
func TestRabbitMQConnectionCutMidRunLosesNothing(t *testing.T) {
	t.Parallel()
	const n = 5000
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_cut")
	topics := topicNames("cut", 5)
	rc := consumeRabbitMQ(t, url, exchange, topics)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))

	tbl := migrated(t)
	ids := writeRoundTrip(t, tbl, topics, n)
	p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, url, proxy.Addr()), Exchange: exchange, MaxBatch: 50})
	require.NoError(t, err)
	cutter := &cuttingProducer{Producer: p, proxy: proxy, every: 5, max: 20}
	stop := runSweeper(t, tbl, cutter)
	dbtest.Eventually(t, 3*time.Minute, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	dbtest.Eventually(t, time.Minute, "every message consumed", func() bool { return rc.distinct() >= n })
	stop()

	seen := map[string]int{}
	for _, msgs := range rc.snapshot() {
		for _, m := range msgs {
			seen[m.messageID]++
		}
	}
	for id, mid := range ids {
		require.NotZero(t, seen[mid], "row %d lost", id)
	}
	cuts := cutter.count()
	t.Logf("%d cuts; %d messages received for %d rows (%d duplicates)", cuts, rc.count(), n, rc.count()-n)
	require.Greater(t, cuts, 1, "the test must cut the connection mid-run")
}

// cuttingProducer cuts the proxy's connections at every every-th send, up to
// max times, at the moment the send starts publishing: a connection broken in
// the middle of a relay, at a point that varies with the scheduling.
type cuttingProducer struct {
	*rabbitmq.Producer
	proxy      *tcpproxy.Proxy
	every, max int

	mu    sync.Mutex
	sends int
	cuts  int
}

func (c *cuttingProducer) Send(ctx context.Context, b producer.Batch) error {
	c.mu.Lock()
	c.sends++
	cut := c.sends%c.every == 0 && c.cuts < c.max
	if cut {
		c.cuts++
	}
	c.mu.Unlock()
	if !cut {
		return c.Producer.Send(ctx, b)
	}
	cutDone := make(chan struct{})
	go func() { defer close(cutDone); c.proxy.Cut() }()
	err := c.Producer.Send(ctx, b)
	<-cutDone
	return err
}

func (c *cuttingProducer) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts
}

// RabbitMQ itself closes the sweeper's connection (rabbitmqctl close_connection,
// reply code 320 CONNECTION_FORCED, as at a broker shutdown) three times while it
// relays: every row arrives at least once.
func TestRabbitMQConnectionForceClosedByBrokerLosesNothing(t *testing.T) {
	t.Parallel()
	ctl, err := exec.LookPath("rabbitmqctl")
	require.NoError(t, err, "this test closes connections with rabbitmqctl: install rabbitmq-server (bash .ci/run does)")
	const n = 6000
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_forced")
	topics := topicNames("forced", 3)
	rc := consumeRabbitMQ(t, url, exchange, topics)
	tbl := migrated(t)
	ids := writeRoundTrip(t, tbl, topics, n)

	name := brokertest.Name("sweeper-forced")
	p, err := rabbitmq.New(rabbitmq.Config{URL: url, Exchange: exchange, MaxBatch: 20, ConnectionName: name})
	require.NoError(t, err)
	// Gated so that the relay is still running at each close, however slow
	// rabbitmqctl is: before the k-th close, at most k quarters of the rows
	// may be sent.
	gate := newGatedProducer(p, n/4)
	s, err := outbox.NewSweeper(dbtest.Pool(t), gate, outbox.Config{Table: tbl, Tick: 10 * time.Millisecond, PageSize: 60})
	require.NoError(t, err)
	stop := dbtest.RunSweeper(t, s)

	closes := 0
	for closes < 3 {
		// Wait until the relay has sent what the gate allows, so each close
		// falls on a relay that is under way.
		dbtest.Eventually(t, 3*time.Minute, "the relay under way", func() bool { return gate.waiting() })
		out, err := exec.Command(ctl, "list_connections", "pid", "client_properties", "-q", "--no-table-headers").CombinedOutput()
		require.NoError(t, err, "%s", out)
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, name) {
				pid := strings.Fields(line)[0]
				out, err := exec.Command(ctl, "close_connection", pid, "outbox-sweeper test").CombinedOutput()
				require.NoError(t, err, "%s", out)
				closes++
				gate.open(n / 4)
			}
		}
	}
	gate.open(n)
	dbtest.Eventually(t, 3*time.Minute, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	dbtest.Eventually(t, time.Minute, "every message consumed", func() bool { return rc.distinct() >= n })
	stop()
	require.NoError(t, p.Close(context.Background()))

	seen := map[string]bool{}
	for _, msgs := range rc.snapshot() {
		for _, m := range msgs {
			seen[m.messageID] = true
		}
	}
	for id, mid := range ids {
		require.True(t, seen[mid], "row %d lost", id)
	}
	require.Equal(t, 3, closes, "the broker must have closed the connection mid-run")
	t.Logf("%d forced closes; %d messages received for %d rows", closes, rc.count(), n)
}

// gatedProducer lets through sends up to a budget of messages, and holds the
// next send (until its context ends) while it would pass it, so that a test
// can break things around a relay it knows is still running.
type gatedProducer struct {
	producer.Producer
	mu      sync.Mutex
	cond    *sync.Cond
	sent    int
	budget  int
	blocked bool
}

func newGatedProducer(p producer.Producer, budget int) *gatedProducer {
	g := &gatedProducer{Producer: p, budget: budget}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *gatedProducer) Send(ctx context.Context, b producer.Batch) error {
	stop := context.AfterFunc(ctx, func() { g.mu.Lock(); g.cond.Broadcast(); g.mu.Unlock() })
	defer stop()
	g.mu.Lock()
	for g.sent+len(b.Messages) > g.budget && ctx.Err() == nil {
		g.blocked = true
		g.cond.Wait()
	}
	g.blocked = false
	g.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	err := g.Producer.Send(ctx, b)
	if err == nil {
		g.mu.Lock()
		g.sent += len(b.Messages)
		g.mu.Unlock()
	}
	return err
}

// waiting reports whether a send is held at the budget.
func (g *gatedProducer) waiting() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.blocked
}

// open raises the budget by n messages.
func (g *gatedProducer) open(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.budget += n
	g.cond.Broadcast()
}

func TestRoundTripNATS(t *testing.T) {
	t.Parallel()
	const n = 10_000
	url := brokertest.NATSURL(t)
	prefix := brokertest.Name("rt")
	topics := topicNames(prefix, 10)

	ctx := context.Background()
	_, stream := brokertest.PrefixStream(t, url, prefix)

	tbl := migrated(t)
	ids := writeRoundTrip(t, tbl, topics, n)
	p, err := outboxnats.New(outboxnats.Config{URL: url})
	require.NoError(t, err)
	stop := runSweeper(t, tbl, p)
	dbtest.Eventually(t, 3*time.Minute, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	stop()

	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	got := map[string][]received{}
	count := 0
	for count < n {
		// Every message is stored by now: a fetch returns as soon as it has
		// its thousand; the wait only bounds a stream that lacks some.
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(time.Minute))
		require.NoError(t, err)
		fetched := 0
		for m := range batch.Messages() {
			var seq float64
			require.NoError(t, json.Unmarshal([]byte(m.Headers().Get("seq")), &seq))
			require.Equal(t, "round-trip", m.Headers().Get("source"))
			got[m.Subject()] = append(got[m.Subject()], received{topic: m.Subject(), messageID: m.Headers().Get("Nats-Msg-Id"),
				correlationID: m.Headers().Get("Correlation-Id"), seq: seq, payload: string(m.Data())})
			fetched++
		}
		require.NotZero(t, fetched, "the stream holds %d of %d messages", count, n)
		count += fetched
	}
	checkRoundTrip(t, got, ids, topics, n)
}

// A subject no stream captures fails as topic-class through the whole relay:
// its rows wait, none charged or dead-lettered, while a healthy subject's
// are delivered; once a stream captures it, every one of its rows arrives.
func TestNATSSubjectWithoutAStreamWaitsUntilOneCapturesIt(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	healthy, missing := brokertest.Name("captured"), brokertest.Name("nostream")
	_, healthyStream := brokertest.PrefixStream(t, url, healthy)
	tbl := migrated(t)
	insertRows(t, tbl, healthy+".orders", 20)
	insertRows(t, tbl, missing+".orders", 5)
	p, err := outboxnats.New(outboxnats.Config{URL: url})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	s, err := outbox.NewSweeper(dbtest.Pool(t), p, outbox.Config{Table: tbl})
	require.NoError(t, err)
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 20, res.Dispatched)
	require.Equal(t, []string{missing + ".orders"}, res.FailedTopics)
	info, err := healthyStream.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(20), info.State.Msgs)
	require.Equal(t, 5, dbtest.Outstanding(t, tbl), "the uncaptured subject's rows wait")
	requireNothingCharged(t, tbl)

	// The stream the application forgot, created: the subject's trial, once
	// its cooldown's ticks have passed (a Sweep is a tick), delivers them.
	_, late := brokertest.PrefixStream(t, url, missing)
	dbtest.Eventually(t, time.Minute, "the uncaptured subject's 5 rows, once captured", func() bool {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
		return dbtest.Outstanding(t, tbl) == 0
	})
	info, err = late.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(5), info.State.Msgs)
	require.Empty(t, deadLetterReasons(t, tbl))
}

// RabbitMQ goes away for longer than the dependency breaker's open duration
// while the application keeps writing. The breaker opens; while it is open no
// send reaches the broker and connection attempts are paced by the breaker, not
// a busy loop; when RabbitMQ is back dispatch resumes by itself and every row,
// written before, during and after the outage, is delivered.
func TestBrokerDownOpensTheDependencyBreakerAndNothingIsLost(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_down")
	topics := topicNames("down", 3)
	rc := consumeRabbitMQ(t, url, exchange, topics)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	tbl := migrated(t)

	// While the broker is down the proxy refuses at once, so no dial or send
	// waits for these timeouts: they only have to outlast a busy machine's
	// handshake and confirms once it is back.
	p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, url, proxy.Addr()), Exchange: exchange, DialTimeout: 30 * time.Second})
	require.NoError(t, err)
	const open = 400 * time.Millisecond
	guarded := breaker.NewDependency(breaker.DependencyConfig{Failures: 2, OpenDuration: open})
	s, err := outbox.NewSweeper(dbtest.Pool(t), p, outbox.Config{Table: tbl, Tick: 20 * time.Millisecond,
		SendTimeout: 30 * time.Second, TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1_000_000}),
		BrokerBreaker: guarded, Retry: breaker.Retry{Attempts: 2, Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond}})
	require.NoError(t, err)
	stopRun := dbtest.RunSweeper(t, s)
	stop := func() {
		stopRun()
		require.NoError(t, guarded.Close(context.Background()))
		require.NoError(t, p.Close(context.Background()))
	}

	// The application writes 30 rows every 20 ms throughout. The sleep paces
	// the writes and d is how long a phase of the scenario lasts: neither
	// waits for an event, and nothing asserted counts the writes.
	written := 0
	write := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			insertRows(t, tbl, topics[written%len(topics)], 30)
			written += 30
		}
	}
	write(300 * time.Millisecond)
	proxy.Refuse(true)
	proxy.Cut()
	dbtest.Eventually(t, time.Minute, "the breaker open", func() bool {
		insertRows(t, tbl, topics[0], 1)
		written++
		return guarded.State() == breaker.DependencyOpen
	})
	acceptsAtOpen, openAt := proxy.Accepts(), time.Now()
	write(1200 * time.Millisecond) // three open durations, or more on a slow machine
	during, elapsed := proxy.Accepts()-acceptsAtOpen, time.Since(openAt)
	// One trial per open duration at most, counted on the wall clock, so a
	// slow machine makes fewer per second, never more: over the time measured
	// (the breaker opened a moment before it began, hence one more), each
	// trial may dial twice (two tries), and sends let through before the
	// breaker opened may still dial. A busy loop would dial hundreds of times.
	limit := 2*(int(elapsed/open)+1) + 4
	require.LessOrEqual(t, during, limit, "connection attempts while the broker is down are paced by the breaker: %d in %s", during, elapsed)

	proxy.Refuse(false)
	write(300 * time.Millisecond)
	dbtest.Eventually(t, 2*time.Minute, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	dbtest.Eventually(t, time.Minute, "every row received", func() bool { return rc.distinct() >= written })
	stop()
	require.Equal(t, breaker.DependencyClosed, guarded.State())
	t.Logf("%d rows written, %d received (%d distinct); %d connection attempts during %s of outage (at most %d allowed)",
		written, rc.count(), rc.distinct(), during, elapsed.Round(time.Millisecond), limit)
}

// A broker that accepts connections and then says nothing: each send ends
// within the send timeout, as a transient failure. The dial timeout is an hour,
// so a send it bounded instead would hold the test far past the generous bound
// below, which a send ended by its 500ms deadline meets on any machine.
func TestHungBrokerEndsEachSendWithinTheSendTimeout(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	proxy.Hang(true)
	p, err := rabbitmq.New(rabbitmq.Config{URL: brokertest.WithHost(t, url, proxy.Addr()), DialTimeout: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	retry := breaker.Retry{Initial: 10 * time.Millisecond, Max: 20 * time.Millisecond}
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		sent := make(chan error, 1)
		go func() {
			sent <- retry.Do(ctx, func(ctx context.Context) error {
				return p.Send(ctx, producer.Batch{Topic: "t", Messages: producertest.Messages("t", 1, 1)})
			})
		}()
		select {
		case err := <-sent:
			cancel()
			require.Error(t, err)
			require.NotEqual(t, producer.ClassTopic, producer.ClassOf(err))
		case <-time.After(time.Minute):
			cancel()
			t.Fatal("the send timeout did not bound a hung broker")
		}
	}
}

// NATS down from the start: the producer cannot ask the server its
// max_payload, but that must not fail the batches' cutting (which the broker
// breaker does not see, and which would count an attempt on every row each
// sweep and so dead-letter the whole outbox). The sends fail, the breaker opens,
// the rows keep their attempts, and all arrive once the server is back.
func TestNATSDownFromTheStartDeadLettersNothing(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	prefix := brokertest.Name("down")
	_, stream := brokertest.PrefixStream(t, url, prefix)
	proxy := tcpproxy.New(t, brokertest.HostPort(t, url))
	proxy.Refuse(true)
	tbl := migrated(t)
	insertRows(t, tbl, prefix+".a", 20)

	// The proxy refuses at once while the server is down: the connect timeout
	// only has to outlast a busy machine once it is back.
	p, err := outboxnats.New(outboxnats.Config{URL: brokertest.WithHost(t, url, proxy.Addr()), ConnectTimeout: 30 * time.Second})
	require.NoError(t, err)
	guarded := breaker.NewDependency(breaker.DependencyConfig{Failures: 2, OpenDuration: 200 * time.Millisecond})
	t.Cleanup(func() { _ = guarded.Close(context.Background()); _ = p.Close(context.Background()) })
	s, err := outbox.NewSweeper(dbtest.Pool(t), p, outbox.Config{Table: tbl, MaxAttempts: 3,
		BrokerBreaker: guarded, Retry: breaker.Retry{Attempts: 1},
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1_000_000})})
	require.NoError(t, err)
	// Twice as many sweeps that read the rows and cut them into batches as
	// --max-attempts (the first two, then a trial each time the breaker turns
	// half-open and the topic's backoff is over): the sweeps in between, which
	// the open breaker or the backoff keep from the rows, do not count. The
	// sleep only paces the sweeps; the count of sweeps that read the rows ends
	// the loop.
	reached := 0
	dbtest.Eventually(t, 2*time.Minute, "six sweeps that read the rows", func() bool {
		res, err := s.Sweep(context.Background())
		require.NoError(t, err)
		if res.Pages > 0 {
			reached++
		}
		time.Sleep(30 * time.Millisecond)
		return reached >= 6
	})
	require.Equal(t, 20, dbtest.Outstanding(t, tbl), "no row dead-lettered while the server was down")
	var deadLetters int
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT count(*) FROM "+
		pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()).Scan(&deadLetters))
	require.Zero(t, deadLetters)

	proxy.Refuse(false)
	dbtest.Eventually(t, 2*time.Minute, "every row dispatched", func() bool {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
		return dbtest.Outstanding(t, tbl) == 0
	})
	info, err := stream.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(20), info.State.Msgs)
}
