package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
)

// floodTopics is how many distinct topics the topic-flood tests write:
// OUTBOX_TEST_FLOOD_TOPICS, or 20,000 (the case is 100,000; under
// the race detector on a shared 2-core machine that takes minutes). The bounds
// the tests assert do not depend on it.
func floodTopics(t *testing.T) int {
	t.Helper()
	if v := os.Getenv("OUTBOX_TEST_FLOOD_TOPICS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "OUTBOX_TEST_FLOOD_TOPICS")
		return n
	}
	return 20_000
}

// writeTopicPerRow writes n rows, each with a topic of its own made by topic,
// in transactions of 1,000 rows.
func writeTopicPerRow(t *testing.T, tbl outbox.Table, n int, topic func(i int) string) {
	t.Helper()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	for i := 0; i < n; i += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for j := i; j < min(i+1000, n); j++ {
			msgs = append(msgs, outbox.Message{Topic: topic(j), Payload: []byte("x")})
		}
		require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), msgs...))
	}
}

// discardProducer accepts every batch and keeps nothing but a count, so that
// what the test measures of the heap is the sweeper's; every tenth topic's
// first send fails (transient), so that the breaker and the backoff hold
// state for a tenth of the topics.
type discardProducer struct {
	sent   atomic.Int64
	mu     sync.Mutex
	failed map[string]bool
}

func (p *discardProducer) Batches(_ context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	b, _, _ := producer.Split(topic, msgs, producer.Limits{Messages: 500})
	return b, nil
}

func (p *discardProducer) Send(_ context.Context, b producer.Batch) error {
	if strings.HasSuffix(b.Topic, "0") {
		p.mu.Lock()
		first := !p.failed[b.Topic]
		if first {
			p.failed[b.Topic] = true
		}
		p.mu.Unlock()
		if first {
			return producer.NewTransientError("busy", errors.New("server busy"))
		}
	}
	p.sent.Add(int64(len(b.Messages)))
	return nil
}

func (p *discardProducer) Close(context.Context) error { return nil }

// get returns the body of GET url.
func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

// heapInUse returns the live heap after a collection.
func heapInUse() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// Issue 30, item 5: rows that each carry a topic of their own (an application
// writing a UUID as the topic) are drained, and what the sweeper keeps of them
// stays bounded whatever their number: /status lists --status-topics of them
// and counts the rest, /metrics has series for --metrics-max-topics topics
// (the rest under topic="_other"), and once the topics are idle the heap is
// back within a few MB of where it started (it grew by about 2.5 KB per topic
// ever seen: 250 MB at 100,000). Not parallel: the heap it measures must be
// its own.
func TestATopicPerRowIsDrainedWithinBoundedMemoryMetricsAndStatus(t *testing.T) {
	n := floodTopics(t)
	const (
		maxTopics    = 50
		statusTopics = 100
		// Bounds that hold for any n: the per-topic metric families hold at
		// most maxTopics+1 label values, each with at most ~20 series; a
		// /status topic is under 1 KB; the heap keeps the activity window
		// (at most 60 seconds of 512 topics), a page and the pools.
		maxSeries      = 25*(maxTopics+1) + 400
		maxStatusBytes = 1024*statusTopics + 64*1024
		maxHeapGrowth  = 24 << 20
	)
	tbl := migrated(t)
	ctx := context.Background()
	writeTopicPerRow(t, tbl, n, func(i int) string { return fmt.Sprintf("bug.%08x-7d2e-4c1a-9b3f-%012d", i, i) })

	reg := prometheus.NewRegistry()
	m := metrics.NewWithConfig(reg, metrics.Config{MaxTopics: maxTopics, TopicIdle: 2 * time.Second})
	topics := breaker.New(breaker.Settings{CooldownTicks: 1, FailureWindow: time.Second, ForgetAfter: time.Second,
		OnStateChange: m.OnTopicChange})
	p := &discardProducer{failed: map[string]bool{}}
	s, err := outbox.NewSweeper(dbtest.Pool(t), p, outbox.Config{Table: tbl, Tick: 20 * time.Millisecond, Observer: m,
		TopicBreaker: topics, Retry: breaker.Retry{Attempts: 1, Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond},
		TopicBackoffMax: 20 * time.Millisecond})
	require.NoError(t, err)
	dead, err := outbox.NewDeadLetters(dbtest.Pool(t), tbl)
	require.NoError(t, err)
	srv := httptest.NewServer(admin.Handler(admin.Config{Pool: dbtest.Pool(t), Table: tbl, Topics: topics, DeadLetters: dead,
		Backoffs: s.TopicBackoffs, Activity: s.TopicActivity, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		StatusTopics: statusTopics, StatusCacheFor: time.Nanosecond}))
	t.Cleanup(srv.Close)

	// Every topic outstanding: the worst case for /status.
	status := get(t, srv.URL+"/status")
	var st struct {
		Topics        []json.RawMessage `json:"topics"`
		TopicsOmitted int               `json:"topics_omitted"`
	}
	require.NoError(t, json.Unmarshal(status, &st))
	require.Len(t, st.Topics, statusTopics)
	require.Equal(t, n-statusTopics, st.TopicsOmitted)
	require.Less(t, len(status), maxStatusBytes, "GET /status with %d topics outstanding", n)
	t.Logf("GET /status with %d topics outstanding: %d bytes", n, len(status))

	before := heapInUse()
	start := time.Now()
	stop := dbtest.RunSweeper(t, s)
	dbtest.Eventually(t, 10*time.Minute, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	t.Logf("%d topics drained in %s", n, time.Since(start).Round(time.Millisecond))
	require.EqualValues(t, n, p.sent.Load())

	// The topics go idle: the breaker forgets them after ForgetAfter, the
	// metrics after TopicIdle (at the scheduled refresh).
	dbtest.Eventually(t, 2*time.Minute, "idle topics' series deleted", func() bool {
		require.NoError(t, m.Refresh(ctx, dbtest.Pool(t), tbl, topics))
		return strings.Contains(string(get(t, srv.URL+"/metrics")), "\noutbox_metrics_topics 0\n")
	})
	var growth int64
	dbtest.Eventually(t, 2*time.Minute, "the heap back within bounds", func() bool {
		growth = int64(heapInUse()) - int64(before)
		return growth < maxHeapGrowth
	})
	t.Logf("heap after the drain: %+.1f MB from before it", float64(growth)/(1<<20))

	body := get(t, srv.URL+"/metrics")
	series, topicLabels := 0, map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "outbox_") {
			continue
		}
		series++
		if i := strings.Index(line, `topic="`); i >= 0 {
			rest := line[i+len(`topic="`):]
			topicLabels[rest[:strings.IndexByte(rest, '"')]] = true
		}
	}
	require.NoError(t, sc.Err())
	require.Less(t, series, maxSeries, "series on /metrics after %d topics", n)
	require.LessOrEqual(t, len(topicLabels), maxTopics+1)
	require.Contains(t, string(body), `outbox_messages_dispatched_total{topic="_other"}`)
	t.Logf("/metrics after the drain: %d series, %d bytes, %d topic label values", series, len(body), len(topicLabels))

	stop()
}

// Issue 30, item 6: a flood of rows on subjects no stream captures (each a
// topic of its own) does not starve a healthy topic: the producer refuses
// each such subject from its stream list at once, so the flood's topics trip
// in microseconds, not in the half second a publish waits for JetStream's
// answer. A healthy row written while the flood is being tripped arrives
// (seen by a subscription on its subject) within a second of its commit at
// the 99th percentile (three seconds under the race detector); it waited
// 45-50 s before. Not parallel: the latency it
// measures is the sweeper's, not that of the package's other tests, which
// run in parallel after it.
func TestAFloodOfTopicsWithoutAStreamDoesNotStarveAHealthyTopic(t *testing.T) {
	n := floodTopics(t)
	const (
		healthyEvery = 20 * time.Millisecond
		minHealthy   = 10 // rows that must be written while the flood lasts
		goal         = time.Second
	)
	url := brokertest.NATSURL(t)
	prefix := brokertest.Name("flood")
	nc, _ := brokertest.PrefixStream(t, url, prefix)
	healthy := prefix + ".healthy"
	tbl := migrated(t)
	writeTopicPerRow(t, tbl, n, func(i int) string { return fmt.Sprintf("nostream_%s.%08x-7d2e-4c1a-9b3f-%012d", prefix, i, i) })

	// Arrivals, by the seq header the row carries.
	var mu sync.Mutex
	arrived := map[int]time.Time{}
	sub, err := nc.Subscribe(healthy, func(m *natsgo.Msg) {
		seq, err := strconv.Atoi(m.Header.Get("seq"))
		if err != nil {
			t.Errorf("healthy message without a seq: %v", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, dup := arrived[seq]; !dup {
			arrived[seq] = time.Now()
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())

	var trips atomic.Int64
	firstTrip := make(chan struct{})
	var once sync.Once
	topics := breaker.New(breaker.Settings{OnStateChange: func(_ string, _, to breaker.State, _ string) {
		if to == breaker.StateTripped {
			trips.Add(1)
			once.Do(func() { close(firstTrip) })
		}
	}})
	p, err := outboxnats.New(outboxnats.Config{URL: url})
	require.NoError(t, err)
	require.NoError(t, p.Connect(context.Background())) // as the binary does at start
	s, err := outbox.NewSweeper(dbtest.Pool(t), p, outbox.Config{Table: tbl, TopicBreaker: topics})
	require.NoError(t, err)
	stop := dbtest.RunSweeper(t, s)
	t.Cleanup(func() { _ = p.Close(context.Background()) })

	select {
	case <-firstTrip:
	case <-time.After(2 * time.Minute):
		t.Fatal("no flood topic tripped within 2 minutes")
	}
	// The healthy topic's rows, one per transaction, while the flood's
	// topics are tripped, and again when their cooldown is over and each is
	// tried again (half-open): until every one has tripped twice.
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	committed := map[int]time.Time{}
	deadline := time.Now().Add(5 * time.Minute)
	for seq := 0; trips.Load() < 2*int64(n); seq++ {
		require.True(t, time.Now().Before(deadline), "the flood's topics tripped %d times in 5 minutes, not twice each", trips.Load())
		require.NoError(t, w.Write(context.Background(), dbtest.Pool(t),
			outbox.Message{Topic: healthy, Payload: []byte("ok"), Headers: map[string]any{"seq": seq}}))
		committed[seq] = time.Now()
		time.Sleep(healthyEvery) // the application's pace, not a wait for an outcome
	}
	t.Logf("%d healthy rows written while %d flood topics tripped, then tripped again", len(committed), n)
	require.GreaterOrEqual(t, len(committed), minHealthy)
	// Not starved: most of the healthy rows arrived while the flood still
	// tripped, not after it. (A starved topic's rows all wait for the flood.)
	mu.Lock()
	during := len(arrived)
	mu.Unlock()
	require.GreaterOrEqual(t, during, len(committed)/2, "healthy rows that arrived while the flood lasted, of %d", len(committed))

	dbtest.Eventually(t, 2*time.Minute, "every healthy row arrived", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(arrived) >= len(committed)
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, 0, len(committed))
	for seq, at := range committed {
		lat = append(lat, arrived[seq].Sub(at))
	}
	slices.Sort(lat)
	p99 := lat[(len(lat)*99+99)/100-1]
	t.Logf("healthy topic commit→arrival over %d rows: p50 %s, p99 %s, max %s", len(lat),
		lat[len(lat)/2].Round(time.Millisecond), p99.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	// The goal (a second) is the binary's, measured by the benchmark, not
	// here: under the race detector the flood's first pass (every topic
	// refused and tripped in one sweep, the listing read again until the
	// discovery floor moves) costs several times as much CPU, p99 about
	// 0.35 s at 20,000 topics on an idle 2-core machine, 1.7 s with four CPU
	// hogs beside it, and machines of this kind differ twice over. Ten
	// times the goal is a backstop against a healthy topic that waits for
	// the flood's whole pass, not a measure.
	require.Less(t, p99, 10*goal, "a healthy topic's p99 commit→arrival during the flood (goal %s)", goal)
}
