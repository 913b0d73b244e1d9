package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/kafka"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

// cluster starts an in-process Kafka cluster (franz-go's kfake, which speaks
// the real protocol) with topics of three partitions each.
func cluster(t *testing.T, topics []string, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, topics...)}, opts...)
	c, err := kfake.NewCluster(opts...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// createTopic creates topic with partitions and the given topic configs.
func createTopic(t *testing.T, c *kfake.Cluster, topic string, partitions int32, configs map[string]string) {
	t.Helper()
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer admin.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = topic, partitions, 1
	for k, v := range configs {
		cc := kmsg.NewCreateTopicsRequestTopicConfig()
		cc.Name, cc.Value = k, &v
		ct.Configs = append(ct.Configs, cc)
	}
	req.Topics = append(req.Topics, ct)
	resp, err := req.RequestWith(context.Background(), admin)
	require.NoError(t, err)
	require.NoError(t, kerr.ErrorForCode(resp.Topics[0].ErrorCode))
}

func newProducer(t *testing.T, c *kfake.Cluster, cfg kafka.Config) *kafka.Producer {
	t.Helper()
	if cfg.Brokers == nil {
		cfg.Brokers = c.ListenAddrs()
	}
	p, err := kafka.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// consume reads n records of topic from its start, with a client of its own,
// and fails t if the topic holds more by then.
func consume(t *testing.T, c *kfake.Cluster, topic string, n int, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	recs := consumeAtLeast(t, c, topic, n, opts...)
	require.Len(t, recs, n)
	return recs
}

// consumeAtLeast reads records of topic from its start, with a client of its
// own, until it has n or more, and returns them all.
func consumeAtLeast(t *testing.T, c *kfake.Cluster, topic string, n int, opts ...kgo.Opt) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}, opts...)...)
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < n {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "read %d of %d records of %s", len(recs), n, topic)
		fs.EachError(func(_ string, _ int32, err error) { require.NoError(t, err) })
		recs = append(recs, fs.Records()...)
	}
	return recs
}

func msgs(topic string, from, n int, key func(i int) string) []producer.Message {
	out := make([]producer.Message, n)
	for i := range out {
		id := from + i
		out[i] = producer.Message{ID: int64(id), MessageID: fmt.Sprintf("00000000-0000-4000-8000-%012d", id), Topic: topic,
			Payload: fmt.Appendf(nil, "%s-%d", topic, id), Headers: []byte("{}")}
		if key != nil {
			out[i].PartitionKey = key(i)
		}
	}
	return out
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

func send(t *testing.T, p *kafka.Producer, topic string, ms []producer.Message) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	batches, err := p.Batches(ctx, topic, ms)
	if err != nil {
		return err
	}
	for _, b := range batches {
		if err := p.Send(ctx, b); err != nil {
			return err
		}
	}
	return nil
}

func TestSendMapsEveryField(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"app.orders"})
	p := newProducer(t, c, kafka.Config{TopicPrefix: "app."})
	m := producer.Message{ID: 7, MessageID: "6f1c7c9e-3f7b-4c47-9e49-6d3c8a1f0b11", Topic: "orders",
		Payload: []byte{0, 1, 2, 0xff, '{'}, Headers: []byte(`{"tenant":"acme","retries":3,"big":12345678901234567890,"flags":{"a":true}}`),
		ContentType: "application/octet-stream", CorrelationID: "corr-1", PartitionKey: "customer-42"}
	require.NoError(t, send(t, p, "orders", []producer.Message{m}))

	r := consume(t, c, "app.orders", 1)[0]
	require.Equal(t, "customer-42", string(r.Key))
	require.Equal(t, m.Payload, r.Value)
	for k, want := range map[string]string{
		kafka.HeaderMessageID: m.MessageID, kafka.HeaderCorrelationID: "corr-1", kafka.HeaderContentType: "application/octet-stream",
		"tenant": "acme", "retries": "3", "big": "12345678901234567890", "flags": `{"a":true}`,
	} {
		got, ok := header(r, k)
		require.True(t, ok, "header %s", k)
		require.Equal(t, want, got, "header %s", k)
	}
	require.Len(t, r.Headers, 7)
}

func TestRowsWithoutKeyOrOptionalColumnsHaveNoKeyAndNoSuchHeaders(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"plain"})
	p := newProducer(t, c, kafka.Config{})
	require.NoError(t, send(t, p, "plain", msgs("plain", 1, 1, nil)))
	r := consume(t, c, "plain", 1)[0]
	require.Nil(t, r.Key)
	require.Len(t, r.Headers, 1, "message-id alone")
	_, ok := header(r, kafka.HeaderMessageID)
	require.True(t, ok)
}

// Per key (one partition each), records arrive in id order, across sends and
// across the client's own retries of requests the broker refused with a
// retriable error and of connections it closed mid-request.
func TestEachKeyArrivesInIDOrderAcrossRetriesAndReconnects(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"ordered"})
	var produces atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		switch produces.Add(1) % 7 {
		case 2: // a retriable refusal of the whole request
			return refusal(req.(*kmsg.ProduceRequest), kerr.NotEnoughReplicas.Code), nil, true
		case 5: // the connection drops before the broker reads the request
			return nil, errors.New("drop the connection"), true
		}
		return nil, nil, false
	})
	p := newProducer(t, c, kafka.Config{MaxBatch: 25})
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	all := msgs("ordered", 1, 250, func(i int) string { return keys[(i*7/3)%len(keys)] })
	require.NoError(t, send(t, p, "ordered", all))
	require.Greater(t, produces.Load(), int64(7), "the control refused some requests")

	recs := consume(t, c, "ordered", len(all))
	seen := map[string][]string{}
	for _, r := range recs {
		id, _ := header(r, kafka.HeaderMessageID)
		seen[string(r.Key)] = append(seen[string(r.Key)], id)
	}
	for _, k := range keys {
		var want []string
		for _, m := range all {
			if m.PartitionKey == k {
				want = append(want, m.MessageID)
			}
		}
		require.Equal(t, want, seen[k], "key %s: every row once, in id order", k)
	}
}

func TestUnknownTopicIsTopicClass(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"exists"})
	p := newProducer(t, c, kafka.Config{})
	require.NoError(t, send(t, p, "exists", msgs("exists", 1, 1, nil)))
	// Every time, not only the first: a send that waited for its deadline
	// would be a timeout (transient), charge the rows and hold their page.
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := p.Send(ctx, producer.Batch{Topic: "missing", Messages: msgs("missing", 1, 3, nil)})
		cancel()
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
		require.Equal(t, "topic_not_found", producer.ReasonOf(err))
		require.Contains(t, err.Error(), `"missing"`)
	}
}

// Over SASL with ACLs: a topic the credentials may not write is topic class
// (its neighbours go on), and credentials the cluster refuses are broker class.
func TestTopicTheCredentialsMayNotWriteIsTopicClassAndBadCredentialsBrokerClass(t *testing.T) {
	t.Parallel()
	allow := func(res kmsg.ACLResourceType, name string, op kmsg.ACLOperation) kfake.ACL {
		return kfake.ACL{Resource: res, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: op, Allow: true}
	}
	c := cluster(t, []string{"open", "secret"}, kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "admin", "admin-pw"),
		kfake.User("SCRAM-SHA-512", "sweeper", "sweeper-pw",
			allow(kmsg.ACLResourceTypeTopic, "open", kmsg.ACLOperationWrite),
			allow(kmsg.ACLResourceTypeTopic, "open", kmsg.ACLOperationDescribe),
			allow(kmsg.ACLResourceTypeCluster, "kafka-cluster", kmsg.ACLOperationIdempotentWrite)),
		kfake.EnableACLs())
	p := newProducer(t, c, kafka.Config{SASL: scram.Auth{User: "sweeper", Pass: "sweeper-pw"}.AsSha512Mechanism()})
	err := send(t, p, "secret", msgs("secret", 1, 1, nil))
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
	require.Equal(t, "unauthorized", producer.ReasonOf(err))
	require.NoError(t, send(t, p, "open", msgs("open", 2, 1, nil)))
	require.Len(t, consume(t, c, "open", 1, kgo.SASL(scram.Auth{User: "admin", Pass: "admin-pw"}.AsSha256Mechanism())), 1)

	wrong := newProducer(t, c, kafka.Config{SASL: scram.Auth{User: "sweeper", Pass: "not-the-password"}.AsSha512Mechanism()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = wrong.Send(ctx, producer.Batch{Topic: "open", Messages: msgs("open", 3, 1, nil)})
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	require.NotContains(t, err.Error(), "not-the-password")
}

// produceRefusal makes the cluster answer every produce request with code,
// for every partition.
func produceRefusal(c *kfake.Cluster, code int16) {
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		return refusal(req.(*kmsg.ProduceRequest), code), nil, true
	})
}

// refusal answers produce request pr with code for each of its partitions.
func refusal(pr *kmsg.ProduceRequest, code int16) *kmsg.ProduceResponse {
	resp := pr.ResponseKind().(*kmsg.ProduceResponse)
	resp.Version = pr.Version
	for _, rt := range pr.Topics {
		st := kmsg.NewProduceResponseTopic()
		st.Topic, st.TopicID = rt.Topic, rt.TopicID
		for _, rp := range rt.Partitions {
			sp := kmsg.NewProduceResponseTopicPartition()
			sp.Partition = rp.Partition
			sp.ErrorCode = code
			st.Partitions = append(st.Partitions, sp)
		}
		resp.Topics = append(resp.Topics, st)
	}
	return resp
}

func TestBrokerRefusalsAreClassifiedDeliberately(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code   *kerr.Error
		class  producer.Class
		reason string
	}{
		{kerr.TopicAuthorizationFailed, producer.ClassTopic, "unauthorized"},
		{kerr.InvalidTopicException, producer.ClassTopic, "invalid_topic"},
		{kerr.ClusterAuthorizationFailed, producer.ClassBroker, "unauthorized"},
		{kerr.InvalidRecord, producer.ClassMessage, producer.ReasonInvalidMessage},
		{kerr.InvalidTimestamp, producer.ClassTopic, "topic_config"},
		{kerr.UnsupportedForMessageFormat, producer.ClassTopic, "topic_config"},
		{kerr.CorruptMessage, producer.ClassTransient, "corrupt_message"},
		{kerr.MessageTooLarge, producer.ClassMessage, producer.ReasonMessageTooLarge},
		{kerr.PolicyViolation, producer.ClassTransient, "policy_violation"},
	} {
		t.Run(tc.code.Message, func(t *testing.T) {
			t.Parallel()
			c := cluster(t, []string{"refused"})
			produceRefusal(c, tc.code.Code)
			p := newProducer(t, c, kafka.Config{})
			err := send(t, p, "refused", msgs("refused", 1, 1, nil))
			require.Error(t, err)
			require.Equal(t, tc.class, producer.ClassOf(err), "%v", err)
			require.Equal(t, tc.reason, producer.ReasonOf(err), "%v", err)
			if tc.class == producer.ClassMessage {
				require.Equal(t, []int64{1}, producer.MessageIDs(err), "a record alone is its row's")
			}
		})
	}
}

func TestInvalidTopicNameFailsTheTopicBeforeAnySend(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"ok"})
	var produces atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		produces.Add(1)
		return nil, nil, false
	})
	p := newProducer(t, c, kafka.Config{})
	for _, topic := range []string{"", ".", "..", "has space", "ünïcode", "a/b", strings.Repeat("x", kafka.MaxTopicLength+1)} {
		_, err := p.Batches(context.Background(), topic, msgs(topic, 1, 1, nil))
		require.Error(t, err, "%q", topic)
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%q: %v", topic, err)
		require.Equal(t, "invalid_topic", producer.ReasonOf(err))
		err = p.Send(context.Background(), producer.Batch{Topic: topic, Messages: msgs(topic, 1, 1, nil)})
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%q: %v", topic, err)
	}
	require.NoError(t, send(t, p, strings.Repeat("x", kafka.MaxTopicLength), nil))
	require.Zero(t, produces.Load())
}

func TestReservedOrEmptyHeaderNamesFailTheRowAlone(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"h"})
	p := newProducer(t, c, kafka.Config{})
	ms := msgs("h", 1, 4, nil)
	ms[1].Headers = []byte(`{"Message-ID":"forged"}`)
	ms[2].Headers = []byte(`{"":"x"}`)
	ms[3].Headers = []byte(`[1,2]`)
	batches, err := p.Batches(context.Background(), "h", ms)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
	require.Equal(t, []int64{2, 3, 4}, producer.MessageIDs(err))
	require.Contains(t, err.Error(), "Message-ID")
	require.Len(t, batches, 1)
	require.Equal(t, []int64{1}, batches[0].IDs())
}

// A record over the topic's max.message.bytes is its row's: the send reads the
// topic's limit before its first produce and names the row, and the cut leaves
// it out from then on; its neighbours are produced.
func TestRecordOverTheTopicsMaxMessageBytesIsItsRowsAlone(t *testing.T) {
	t.Parallel()
	c := cluster(t, nil)
	createTopic(t, c, "small", 1, map[string]string{"max.message.bytes": "4096"})

	p := newProducer(t, c, kafka.Config{})
	ms := msgs("small", 1, 3, nil)
	ms[1].Payload = make([]byte, 5000)
	err := p.Send(context.Background(), producer.Batch{Topic: "small", Messages: ms})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
	require.Equal(t, producer.ReasonMessageTooLarge, producer.ReasonOf(err))
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.Contains(t, err.Error(), "max.message.bytes of 4096")

	batches, err := p.Batches(context.Background(), "small", ms)
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	var ids []int64
	for _, b := range batches {
		require.NoError(t, p.Send(context.Background(), b))
		ids = append(ids, b.IDs()...)
	}
	require.Equal(t, []int64{1, 3}, ids)
	require.Len(t, consume(t, c, "small", 2), 2)
}

// A record refused in one partition fails that partition's record batch
// only: the records the other partitions wrote are named delivered, so that
// the sweeper sends them no more (issue 34: it resent the whole batch). The
// refusal comes from the broker here: the topic's limit is lowered after the
// producer read it.
func TestARefusalInOnePartitionNamesWhatTheOthersWrote(t *testing.T) {
	t.Parallel()
	c := cluster(t, nil)
	createTopic(t, c, "parts", 3, nil)
	p := newProducer(t, c, kafka.Config{})
	require.NoError(t, send(t, p, "parts", msgs("parts", 1, 1, nil))) // reads the topic's limit

	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer admin.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType, res.ResourceName = kmsg.ConfigResourceTypeTopic, "parts"
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name, cfg.Value = "max.message.bytes", kmsg.StringPtr("4096")
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(context.Background(), admin)
	require.NoError(t, err)
	require.NoError(t, kerr.ErrorForCode(resp.Resources[0].ErrorCode))

	keys := []string{"a", "b", "c"}
	ms := msgs("parts", 2, 30, func(i int) string { return keys[i%3] })
	ms[13].Payload = make([]byte, 5000) // row 15; random, so that no compression shrinks it
	for i := range ms[13].Payload {
		ms[13].Payload[i] = byte(rand.Uint32())
	}
	err = p.Send(context.Background(), producer.Batch{Topic: "parts", Messages: ms})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
	// The partition of a key, as the producer's client picks it (Kafka's
	// murmur2 of the key).
	parts := kgo.StickyKeyPartitioner(nil).ForTopic("parts")
	partition := func(m producer.Message) int {
		return parts.Partition(&kgo.Record{Key: []byte(m.PartitionKey)}, 3)
	}
	// franz-go may cut a partition's records into more than one record
	// batch: those of the refused partition in a batch before the large
	// record's are written too, and named delivered as well.
	refused := partition(ms[13])
	delivered := producer.Delivered(err)
	var want []int64
	var rest []producer.Message
	for _, m := range ms {
		switch {
		case partition(m) != refused:
			want = append(want, m.ID)
		case m.ID != 15 && !slices.Contains(delivered, m.ID):
			rest = append(rest, m)
		}
	}
	require.NotEmpty(t, want, "the keys fall in more than one partition")
	require.Subset(t, delivered, want, "the records of the partitions that wrote theirs: %v", err)
	require.NotContains(t, delivered, int64(15), "the refused record is not delivered")
	require.True(t, slices.IsSorted(delivered))

	// The sweeper sends the rest again, cut until the refused row stands
	// alone; a consumer then counts every other row exactly once.
	require.NoError(t, p.Send(context.Background(), producer.Batch{Topic: "parts", Messages: rest}))
	count := map[string]int{}
	for _, r := range consume(t, c, "parts", 1+29) {
		count[string(r.Value)]++
	}
	for _, m := range ms {
		if m.ID != 15 {
			require.Equal(t, 1, count[string(m.Payload)], "row %d written once", m.ID)
		}
	}
}

// Batches keeps each batch within the topic's max.message.bytes, so that a
// partition's records fit one record batch.
func TestBatchesAreCutByTheTopicsLimit(t *testing.T) {
	t.Parallel()
	c := cluster(t, nil)
	createTopic(t, c, "cut", 3, map[string]string{"max.message.bytes": "20000"})
	p := newProducer(t, c, kafka.Config{})
	ms := msgs("cut", 1, 40, nil)
	for i := range ms {
		ms[i].Payload = make([]byte, 1000)
	}
	require.NoError(t, send(t, p, "cut", ms[:1])) // reads the limit
	batches, err := p.Batches(context.Background(), "cut", ms)
	require.NoError(t, err)
	require.Greater(t, len(batches), 2, "40 records of 1,000 bytes in batches of under 20,000")
	for _, b := range batches {
		require.LessOrEqual(t, len(b.Messages), 19)
		require.NoError(t, p.Send(context.Background(), b))
	}
	require.Len(t, consume(t, c, "cut", 41), 41)
}

func TestBrokersThatCannotBeReachedAreBrokerClass(t *testing.T) {
	t.Parallel()
	addr := producertest.ClosedAddr(t)
	p, err := kafka.New(kafka.Config{Brokers: []string{addr}})
	require.NoError(t, err)
	defer p.Close(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = p.Send(ctx, producer.Batch{Topic: "t", Messages: msgs("t", 1, 2, nil)})
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	require.NoError(t, ctx.Err(), "the send failed before its deadline")
	require.Contains(t, err.Error(), addr)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(p.Check(ctx)))
	batches, err := p.Batches(ctx, "t", msgs("t", 1, 2, nil))
	require.NoError(t, err, "cutting needs no broker")
	require.Len(t, batches, 1)
}

// A broker that takes a request and never answers: the send ends by its
// context's deadline (the sweeper's --send-timeout), and Close ends a send in
// flight with a local error.
func TestHungBrokerEndsTheSendByItsDeadlineAndCloseEndsASendInFlight(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"hang"})
	p := newProducer(t, c, kafka.Config{})
	require.NoError(t, send(t, p, "hang", msgs("hang", 1, 1, nil))) // connected, limit read

	hung := make(chan struct{}, 8)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		hung <- struct{}{}
		return nil, nil, true // no answer, connection open
	})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.Send(ctx, producer.Batch{Topic: "hang", Messages: msgs("hang", 2, 3, nil)})
	require.Error(t, err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 10*time.Second, "ended by the deadline, not the request timeout")

	done := make(chan error, 1)
	go func() {
		done <- p.Send(context.Background(), producer.Batch{Topic: "hang", Messages: msgs("hang", 5, 1, nil)})
	}()
	<-hung // the first send's request
	select {
	case <-hung: // the second's
	case <-time.After(30 * time.Second):
		t.Fatal("the second send never reached the broker")
	}
	require.NoError(t, p.Close(context.Background()))
	select {
	case err := <-done:
		require.Equal(t, producer.ClassLocal, producer.ClassOf(err), "%v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not end the send in flight")
	}
	err = p.Send(context.Background(), producer.Batch{Topic: "hang", Messages: msgs("hang", 6, 1, nil)})
	require.Equal(t, producer.ClassLocal, producer.ClassOf(err))
}

func TestCheckPassesAgainstAClusterAndFailsOnceItIsGone(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"x"})
	p := newProducer(t, c, kafka.Config{})
	require.NoError(t, p.Check(context.Background()))
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := p.Check(ctx)
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
	err = p.Send(ctx, producer.Batch{Topic: "x", Messages: msgs("x", 1, 1, nil)})
	require.Equal(t, producer.ClassBroker, producer.ClassOf(err), "%v", err)
}

// A topic's first send needs its max.message.bytes: when the cluster does not
// answer that request, the send fails as transient and produces nothing (the
// rows are tried again), rather than fixing franz-go's batch cap at the
// fallback; once the cluster answers, the send goes through.
func TestFirstSendWithoutTheTopicsLimitIsTransient(t *testing.T) {
	t.Parallel()
	c := cluster(t, []string{"unsized"})
	var produces atomic.Int64
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		produces.Add(1)
		return nil, nil, false
	})
	c.ControlKey(int16(kmsg.DescribeConfigs), func(kmsg.Request) (kmsg.Response, error, bool) {
		return nil, nil, true // taken, never answered; handled once, then dropped
	})
	p := newProducer(t, c, kafka.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := p.Send(ctx, producer.Batch{Topic: "unsized", Messages: msgs("unsized", 1, 1, nil)})
	require.Error(t, err)
	require.Equal(t, producer.ClassTransient, producer.ClassOf(err), "%v", err)
	require.Equal(t, "no_topic_config", producer.ReasonOf(err))
	require.Contains(t, err.Error(), "max.message.bytes")
	require.Zero(t, produces.Load(), "nothing produced")

	// kfake answers a connection's requests in order, so this one goes
	// through once the client gives up on the hung request (its request
	// timeout) and opens another connection.
	require.NoError(t, send(t, p, "unsized", msgs("unsized", 1, 1, nil)))
	require.Len(t, consume(t, c, "unsized", 1), 1)
}
