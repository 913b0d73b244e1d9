package servicebus

// No Service Bus namespace can be reached from the machines that run these
// tests, so they drive the producer through the narrow sender interface with a
// fake whose batches count bytes the way the SDK's do (body plus properties plus
// a fixed overhead per message) against a limit. What they prove: cutting at the
// size limit and at MaxBatch, rejecting a message too large for an empty batch,
// the field mapping, the sender cache, and the error classification of every
// code and condition. What they cannot: the SDK's exact AMQP size accounting,
// authentication, and a real entity's answers (see docs/producers.md, "Azure
// Service Bus").

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/producer"
)

const messageOverhead = 64

// fakeBatch accepts messages while their estimated size fits maxBytes.
type fakeBatch struct {
	maxBytes int
	size     int
	msgs     []*azservicebus.Message
}

func (b *fakeBatch) AddMessage(m *azservicebus.Message, _ *azservicebus.AddMessageOptions) error {
	size := len(m.Body) + messageOverhead
	if m.MessageID != nil {
		size += len(*m.MessageID)
	}
	for k, v := range m.ApplicationProperties {
		size += len(k) + len(fmt.Sprint(v))
	}
	if b.size+size > b.maxBytes {
		return azservicebus.ErrMessageTooLarge
	}
	b.size += size
	b.msgs = append(b.msgs, m)
	return nil
}

func (b *fakeBatch) NumMessages() int32 { return int32(len(b.msgs)) }

// fakeSender records what it sent; sendErr fails the next sends.
type fakeSender struct {
	entity   string
	maxBytes int
	sent     [][]*azservicebus.Message
	sendErr  error
	newErr   error
	closed   atomic.Bool // the producer closes a dropped sender in the background
}

func (s *fakeSender) NewMessageBatch(context.Context) (messageBatch, error) {
	if s.newErr != nil {
		return nil, s.newErr
	}
	return &fakeBatch{maxBytes: s.maxBytes}, nil
}

func (s *fakeSender) SendMessageBatch(_ context.Context, b messageBatch) error {
	if s.sendErr != nil {
		return s.sendErr
	}
	s.sent = append(s.sent, b.(*fakeBatch).msgs)
	return nil
}

func (s *fakeSender) Close(context.Context) error { s.closed.Store(true); return nil }

// bundle is a producer over fake senders of maxBytes each.
type bundle struct {
	p       *Producer
	senders map[string]*fakeSender
	created int
}

func setup(maxBytes, maxBatch int) *bundle {
	b := &bundle{senders: map[string]*fakeSender{}}
	b.p = newProducer(Config{MaxBatch: maxBatch}, func(entity string) (sender, error) {
		b.created++
		s := &fakeSender{entity: entity, maxBytes: maxBytes}
		b.senders[entity] = s
		return s, nil
	})
	return b
}

func msgs(topic string, n, payload int) []producer.Message {
	out := make([]producer.Message, n)
	for i := range out {
		out[i] = producer.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("id-%04d", i+1), Topic: topic,
			Payload: make([]byte, payload), Headers: []byte(`{}`)}
	}
	return out
}

// Each message is 100 + 64 + 7 = 171 bytes; a 1000-byte batch holds 5.
func TestBatchesSplitAtTheSizeLimit(t *testing.T) {
	t.Parallel()
	b := setup(1000, 100)
	batches, err := b.p.Batches(context.Background(), "orders", msgs("orders", 12, 100))
	require.NoError(t, err)
	var sizes []int
	for _, x := range batches {
		sizes = append(sizes, len(x.Messages))
	}
	require.Equal(t, []int{5, 5, 2}, sizes)
	require.Equal(t, []int64{6, 7, 8, 9, 10}, batches[1].IDs(), "order kept across the cut")
}

func TestBatchesCutAtMaxBatch(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 4)
	batches, err := b.p.Batches(context.Background(), "orders", msgs("orders", 10, 10))
	require.NoError(t, err)
	require.Len(t, batches, 3)
	require.Len(t, batches[2].Messages, 2)
}

func TestTooLargeSingleMessageIsMessageClass(t *testing.T) {
	t.Parallel()
	b := setup(1000, 100)
	in := msgs("orders", 4, 100)
	in[1].Payload = make([]byte, 2000)
	batches, err := b.p.Batches(context.Background(), "orders", in)
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.ReasonOf(err))
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.ErrorContains(t, err, "row 2 (2000 bytes of payload) is too large for an empty Service Bus batch")
	require.Len(t, batches, 1)
	require.Equal(t, []int64{1, 3, 4}, batches[0].IDs(), "the others are batched")
}

func TestSendMapsEveryField(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	m := producer.Message{ID: 1, MessageID: "6f1c2a0e-8d9b-4b8e-9a51-3f0b7e0c1d22", Topic: "orders", Payload: []byte("hi"),
		Headers:     []byte(`{"tenant":"acme","n":2,"f":1.5,"ok":true,"nested":{"a":[1]},"nothing":null,"big":1234567890123456789}`),
		ContentType: "application/json", CorrelationID: "req-1", PartitionKey: "order-42"}
	require.NoError(t, b.p.Send(context.Background(), producer.Batch{Topic: "orders", Messages: []producer.Message{m}}))
	sent := b.senders["orders"].sent
	require.Len(t, sent, 1)
	got := sent[0][0]
	require.Equal(t, m.MessageID, *got.MessageID)
	require.Equal(t, []byte("hi"), got.Body)
	require.Equal(t, "application/json", *got.ContentType)
	require.Equal(t, "req-1", *got.CorrelationID)
	require.Equal(t, "order-42", *got.SessionID)
	require.Equal(t, map[string]any{"tenant": "acme", "n": int64(2), "f": 1.5, "ok": true, "nested": `{"a":[1]}`, "big": int64(1234567890123456789)}, got.ApplicationProperties)

	m.ContentType, m.CorrelationID, m.PartitionKey, m.Headers = "", "", "", []byte(`{}`)
	require.NoError(t, b.p.Send(context.Background(), producer.Batch{Topic: "orders", Messages: []producer.Message{m}}))
	got = b.senders["orders"].sent[1][0]
	require.Nil(t, got.ContentType)
	require.Nil(t, got.CorrelationID)
	require.Nil(t, got.SessionID)
	require.Nil(t, got.ApplicationProperties)
}

// A row's deadline travels as the message's time to live, the time left at
// the send, and a message built by Batches (Message.Prepared) gets its own
// at each send; a row without one has none.
func TestTheRowsDeadlineTravelsAsTheTimeToLive(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	ms := []producer.Message{
		{ID: 1, MessageID: "a", Topic: "orders", Payload: []byte("x"), Headers: []byte(`{}`), ExpiresAt: time.Now().Add(time.Hour)},
		{ID: 2, MessageID: "b", Topic: "orders", Payload: []byte("y"), Headers: []byte(`{}`)},
	}
	batches, err := b.p.Batches(context.Background(), "orders", ms)
	require.NoError(t, err)
	require.Len(t, batches, 1)
	require.NoError(t, b.p.Send(context.Background(), batches[0]))
	got := b.senders["orders"].sent[0]
	require.NotNil(t, got[0].TimeToLive)
	require.InDelta(t, time.Hour, *got[0].TimeToLive, float64(time.Minute))
	require.Nil(t, got[1].TimeToLive)

	batches[0].Messages[0].ExpiresAt = time.Now().Add(-time.Second) // passed since: the least the service takes
	require.NoError(t, b.p.Send(context.Background(), batches[0]))
	require.Equal(t, time.Millisecond, *b.senders["orders"].sent[1][0].TimeToLive)
	require.InDelta(t, time.Hour, *got[0].TimeToLive, float64(time.Minute), "each send has a message of its own")
}

func TestInvalidHeadersAreMessageClass(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	in := msgs("orders", 3, 1)
	in[0].Headers = []byte(`[1]`)
	batches, err := b.p.Batches(context.Background(), "orders", in)
	require.Equal(t, []int64{1}, producer.MessageIDs(err))
	require.Equal(t, producer.ReasonInvalidMessage, producer.ReasonOf(err))
	require.Equal(t, []int64{2, 3}, batches[0].IDs())
}

// One sender per entity, reused, and closed by Close; a send after Close is a
// local failure.
func TestSendersAreCachedPerEntityAndClosed(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	ctx := context.Background()
	for range 3 {
		require.NoError(t, b.p.Send(ctx, producer.Batch{Topic: "a", Messages: msgs("a", 2, 1)}))
		require.NoError(t, b.p.Send(ctx, producer.Batch{Topic: "b", Messages: msgs("b", 2, 1)}))
	}
	require.Equal(t, 2, b.created)
	require.NoError(t, b.p.Close(ctx))
	require.True(t, b.senders["a"].closed.Load())
	require.True(t, b.senders["b"].closed.Load())
	err := b.p.Send(ctx, producer.Batch{Topic: "a", Messages: msgs("a", 1, 1)})
	require.Equal(t, producer.ClassLocal, producer.ClassOf(err))
}

// A sender the SDK reports closed is dropped and created again on the next send.
func TestClosedSenderIsReplaced(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	ctx := context.Background()
	require.NoError(t, b.p.Send(ctx, producer.Batch{Topic: "a", Messages: msgs("a", 1, 1)}))
	b.senders["a"].sendErr = &azservicebus.Error{Code: azservicebus.CodeClosed}
	first := b.senders["a"]
	err := b.p.Send(ctx, producer.Batch{Topic: "a", Messages: msgs("a", 1, 1)})
	require.Equal(t, producer.ClassTransient, producer.ClassOf(err))
	require.Eventually(t, first.closed.Load, time.Minute, time.Millisecond)
	require.NoError(t, b.p.Send(ctx, producer.Batch{Topic: "a", Messages: msgs("a", 1, 1)}))
	require.Equal(t, 2, b.created)
}

func TestErrorClassification(t *testing.T) {
	t.Parallel()
	remote := func(cond string) error {
		return &amqp.LinkError{RemoteErr: &amqp.Error{Condition: amqp.ErrCond(cond), Description: "from the service"}}
	}
	for _, tc := range []struct {
		name   string
		err    error
		class  producer.Class
		reason string
	}{
		{"code unauthorized", &azservicebus.Error{Code: azservicebus.CodeUnauthorizedAccess}, producer.ClassTopic, "unauthorized"},
		{"code not found", &azservicebus.Error{Code: azservicebus.CodeNotFound}, producer.ClassTopic, "not_found"},
		{"code connection lost", &azservicebus.Error{Code: azservicebus.CodeConnectionLost}, producer.ClassBroker, "connection_lost"},
		{"code timeout", &azservicebus.Error{Code: azservicebus.CodeTimeout}, producer.ClassTransient, "timeout"},
		{"code closed", &azservicebus.Error{Code: azservicebus.CodeClosed}, producer.ClassTransient, "closed"},
		{"amqp not found", remote("amqp:not-found"), producer.ClassTopic, "not_found"},
		{"amqp unauthorized", remote("amqp:unauthorized-access"), producer.ClassTopic, "unauthorized"},
		{"entity disabled", remote("com.microsoft:entity-disabled"), producer.ClassTopic, "entity_disabled"},
		{"entity full", remote("amqp:resource-limit-exceeded"), producer.ClassTopic, "entity_full"},
		{"not allowed", remote("amqp:not-allowed"), producer.ClassTopic, "not_allowed"},
		{"server busy", remote("com.microsoft:server-busy"), producer.ClassTransient, "server_busy"},
		{"service timeout", remote("com.microsoft:timeout"), producer.ClassTransient, "timeout"},
		{"message size", remote("amqp:link:message-size-exceeded"), producer.ClassMessage, producer.ReasonMessageTooLarge},
		{"detach forced", remote("amqp:link:detach-forced"), producer.ClassTransient, "link_detached"},
		{"session ended", &amqp.SessionError{}, producer.ClassTransient, "link_detached"},
		{"connection closed", &amqp.ConnError{}, producer.ClassBroker, "connection_lost"},
		{"too large sentinel", azservicebus.ErrMessageTooLarge, producer.ClassMessage, producer.ReasonMessageTooLarge},
		{"wrapped code inside", fmt.Errorf("send: %w", &azservicebus.Error{Code: azservicebus.CodeNotFound}), producer.ClassTopic, "not_found"},
		{"unknown", errors.New("something else"), producer.ClassTransient, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := classify(tc.err)
			require.Equal(t, tc.class, producer.ClassOf(err), "%v", err)
			require.Equal(t, tc.reason, producer.ReasonOf(err))
			require.ErrorIs(t, err, tc.err, "the cause stays in the chain")
		})
	}
}

// A send error reaches the sweeper classified, with the entity named.
func TestSendErrorsAreClassified(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	ctx := context.Background()
	require.NoError(t, b.p.Send(ctx, producer.Batch{Topic: "gone", Messages: msgs("gone", 1, 1)}))
	b.senders["gone"].sendErr = &amqp.LinkError{RemoteErr: &amqp.Error{Condition: amqp.ErrCondNotFound}}
	err := b.p.Send(ctx, producer.Batch{Topic: "gone", Messages: msgs("gone", 1, 1)})
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err))
	require.ErrorContains(t, err, `send 1 messages to "gone"`)

	b.senders["gone"].newErr = &azservicebus.Error{Code: azservicebus.CodeUnauthorizedAccess}
	_, err = b.p.Batches(ctx, "gone", msgs("gone", 1, 1))
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err))
	require.Equal(t, "unauthorized", producer.ReasonOf(err))
}

func TestNewNeedsOneWayToAuthenticate(t *testing.T) {
	t.Parallel()
	_, err := New(Config{})
	require.ErrorContains(t, err, "set --servicebus-connection-string or --servicebus-namespace")
	_, err = New(Config{ConnectionString: "x", Namespace: "y"})
	require.ErrorContains(t, err, "use one")
	_, err = New(Config{ConnectionString: "not a connection string"})
	require.ErrorContains(t, err, "invalid connection string (--servicebus-connection-string)")
	p, err := New(Config{ConnectionString: "Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=send;SharedAccessKey=c2VjcmV0"})
	require.NoError(t, err, "a well-formed string creates a client without connecting")
	require.NoError(t, p.Close(context.Background()))
}

// A batch that no longer fits one SDK batch when it is sent (the entity's limit
// shrank after Batches cut it) sends nothing, so no part of it goes twice, and
// fails transiently for the next tick to cut it again.
func TestSendOfABatchThatNoLongerFitsSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(1000, 100)
	ctx := context.Background()
	batches, err := b.p.Batches(ctx, "orders", msgs("orders", 5, 100))
	require.NoError(t, err)
	require.Len(t, batches, 1)
	b.senders["orders"].maxBytes = 500 // holds two of the five now
	err = b.p.Send(ctx, batches[0])
	require.Equal(t, producer.ClassTransient, producer.ClassOf(err))
	require.ErrorContains(t, err, "row 3")
	require.Empty(t, b.senders["orders"].sent, "nothing sent")
}

// The service's rejection of a whole batch for size names the batch's largest
// row, so the sweeper dead-letters that row alone and sends its neighbours.
func TestServiceRejectionForSizeNamesTheLargestRow(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	ctx := context.Background()
	rows := msgs("orders", 3, 10)
	rows[1].Payload = make([]byte, 500)
	require.NoError(t, b.p.Send(ctx, producer.Batch{Topic: "orders", Messages: rows[:1]}))
	b.senders["orders"].sendErr = &amqp.LinkError{RemoteErr: &amqp.Error{Condition: amqp.ErrCondMessageSizeExceeded}}
	err := b.p.Send(ctx, producer.Batch{Topic: "orders", Messages: rows})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err))
	require.Equal(t, producer.ReasonMessageTooLarge, producer.ReasonOf(err))
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
}
