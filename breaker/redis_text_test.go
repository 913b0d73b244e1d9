package breaker_test

import (
	"context"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/metrics"
)

// A topic that is not valid UTF-8 in the shared state (written by hand here; an
// instance over a SQL_ASCII database trips such topics by itself) used to
// crash every instance sharing that Redis, on every start, through the metrics:
// the tick that made it half-open told OnStateChange, whose metrics call
// panicked, and so did the refresh of outbox_topic_tripped from Tripped. The
// breaker hands the topic on as is, byte for byte, to the plan,
// the list and the hook; the metrics layer escapes it; nothing panics, and
// Redis is not taken for down.
func TestRedisTopicThatIsNotUTF8ReachesConsumersAsIs(t *testing.T) {
	t.Parallel()
	const topic = "orders\xff\xfe"
	ctx := context.Background()
	client := brokertest.RedisClient(t, brokertest.RedisURL(t))
	prefix := brokertest.RedisPrefix(t, client, "outbox-breaker-test")
	require.NoError(t, client.HSet(ctx, prefix+":topics", topic,
		"{\"state\":\"tripped\",\"ticks_left\":0,\"cooldown\":1,\"trips\":1,\"tripped_at\":0,\"last_error\":\"bad\xffbytes\"}").Err())

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	var (
		mu      sync.Mutex
		changed []string
	)
	b, err := breaker.NewRedis(breaker.RedisConfig{Client: client, Prefix: prefix, Instance: "one", Lease: time.Minute,
		OpTimeout: patientOp, // Redis is up throughout: a slow answer must not be taken for an outage
		Settings: breaker.Settings{OnStateChange: func(topic string, from, to breaker.State, reason string) {
			mu.Lock()
			changed = append(changed, topic)
			mu.Unlock()
			m.OnTopicChange(topic, from, to, reason)
		}},
		OnRedisError: func(err error) { t.Errorf("Redis taken for down: %v", err) }})
	require.NoError(t, err)

	require.Equal(t, []string{topic}, b.Plan().Excluded, "the plan leaves the topic out by its own bytes")
	st := b.Tripped()
	require.Len(t, st, 1)
	require.Equal(t, topic, st[0].Topic, "the list gives the topic as is")
	require.True(t, utf8.ValidString(st[0].LastError), "the last error is read as JSON, which makes it UTF-8")
	require.Equal(t, breaker.StateTripped, b.State(topic))

	require.NotPanics(t, b.OnTick, "the cooldown ends: half-open, told to the hook")
	require.Equal(t, breaker.StateHalfOpen, b.State(topic))
	mu.Lock()
	require.Equal(t, []string{topic}, changed, "the hook gets the topic as is")
	mu.Unlock()
	require.Equal(t, 1.0, testutil.ToFloat64(m.Tripped(topic)))
	_, err = reg.Gather()
	require.NoError(t, err)

	// A failed trial trips it again, in Redis, under the same bytes; a reset
	// closes it there.
	p := b.Plan()
	require.True(t, p.Trials[topic])
	b.Failure(topic, p.Gen(topic), false, "still failing \xff")
	require.Equal(t, breaker.StateTripped, b.State(topic))
	b.Reset(topic)
	require.Equal(t, breaker.StateClosed, b.State(topic))
	n, err := client.HLen(ctx, prefix+":topics").Result()
	require.NoError(t, err)
	require.Zero(t, n, "the hand-written key is gone")
	require.False(t, b.Degraded())
	require.Equal(t, 0.0, testutil.ToFloat64(m.Tripped(topic)))
}

// A topic that is not valid UTF-8 and trips on this instance (a SQL_ASCII
// outbox holds such rows) goes to Redis and back byte for byte: another
// instance sees the same topic, so it leaves the same rows out.
func TestRedisKeepsTheBytesOfATopicThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	one, two := sharedPair(t, breaker.Settings{}, time.Minute)
	for _, topic := range []string{"\xff", "a\xc3", "\xed\xa0\x80", "ok", "é"} {
		one.Failure(topic, one.Plan().Gen(topic), true, "unroutable \xff")
	}
	require.ElementsMatch(t, []string{"a\xc3", "ok", "\xc3\xa9", "\xed\xa0\x80", "\xff"}, two.Plan().Excluded)
	for _, st := range two.Tripped() {
		require.Equal(t, breaker.StateTripped, two.State(st.Topic), "%q", st.Topic)
	}
	two.Reset("\xff")
	require.Equal(t, breaker.StateClosed, one.State("\xff"))
	require.Len(t, one.Tripped(), 4)
}
