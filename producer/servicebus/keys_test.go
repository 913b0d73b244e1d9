package servicebus

// The answers of partitioned and session-enabled entities, replayed by a fake
// sender with the condition and the description public threads show for them
// (Azure/amqpnetlite#120, Azure/azure-service-bus-dotnet#565,
// Xabaril/AspNetCore.Diagnostics.HealthChecks#255, Particular/NServiceBus#5364).
// What the service really checks, and in which order, only a real namespace
// shows (docs/producers.md, "Azure Service Bus").

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/Azure/go-amqp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const (
	refusedMixed = "Batching brokered messages with distinct SessionId or PartitionKey is not supported for an entity with partitioning enabled. " +
		"Reference:2f6a3b1c-0000-4000-8000-000000000001, TrackingId:2a3a44f400000123000cb8565730644a_G26_B20, SystemTracker:ns:topic:%s~111, Timestamp:5/9/2016 10:19:55 AM"
	refusedMixedIDs = "Batching brokered messages with distinct SessionId, PartitionKey, or MessageId  is not supported for an entity with partitioning and duplicate detection enabled." +
		"LogicalPartitionId:206::PartitionKey:::SessionId:::MessageId:7301261e16c847a19193ae6d227d5d58::ViaPartitionKey::: Reference:a6c69e87-7599-44bf-a832-5246e9d45b64, " +
		"TrackingId:375ad65f-1979-4c3d-8ccb-bc9125b50e48_B14, SystemTracker:ns:queue:%s~95, Timestamp:2019-08-16T12:07:37"
	refusedNoSession = "The SessionId was not set on a message, and it cannot be sent to the entity. Entities that have session support enabled can only receive " +
		"messages that have the SessionId set to a valid value. Reference:824e1746-6d61-418d-a18e-cfc3478e01de, TrackingId:985610410000d6a6000210085cba479d_G19_B6, " +
		"SystemTracker:ns:Queue:%s, Timestamp:2019-04-19T22:11:41"
)

// entityKinds says what a fake entity checks of a batch, as the service does.
type entityKinds struct {
	partitioned, dedup, sessions bool
	notFound                     bool
	// mixedFirst: a batch that mixes keys and lacks a session id is
	// refused as mixed (the threads do not say which the service checks
	// first).
	mixedFirst bool
	// busyOn: a batch holding this message id fails, as a busy service's
	// send does.
	busyOn string
}

// strictSender is a sender of one entity of such a kind: it refuses what the
// entity would, with the service's condition and description, and keeps what
// it took.
type strictSender struct {
	entity  string
	kinds   entityKinds
	mu      sync.Mutex
	sent    [][]*azservicebus.Message
	refused int
}

func notAllowed(format, entity string) error {
	return &amqp.Error{Condition: amqp.ErrCondNotAllowed, Description: fmt.Sprintf(format, entity)}
}

func (s *strictSender) NewMessageBatch(context.Context) (messageBatch, error) {
	if s.kinds.notFound {
		return nil, &azservicebus.Error{Code: azservicebus.CodeNotFound}
	}
	return &fakeBatch{maxBytes: 1 << 20}, nil
}

func (s *strictSender) SendMessageBatch(_ context.Context, b messageBatch) error {
	msgs := b.(*fakeBatch).msgs
	s.mu.Lock()
	defer s.mu.Unlock()
	refuse := func(err error) error { s.refused++; return err }
	keys, ids := map[string]bool{}, map[string]bool{}
	if s.kinds.partitioned && s.kinds.mixedFirst {
		for _, m := range msgs {
			if (m.PartitionKey == nil) != (msgs[0].PartitionKey == nil) || (m.PartitionKey != nil && *m.PartitionKey != *msgs[0].PartitionKey) {
				return refuse(notAllowed(refusedMixed, s.entity))
			}
		}
	}
	for _, m := range msgs {
		if s.kinds.sessions && m.SessionID == nil {
			return refuse(&amqp.LinkError{RemoteErr: notAllowed(refusedNoSession, s.entity).(*amqp.Error)})
		}
		if m.SessionID != nil && m.PartitionKey != nil && *m.SessionID != *m.PartitionKey {
			return refuse(errors.New("SessionId cannot be set to a different value than PartitionKey"))
		}
		k := ""
		if m.PartitionKey != nil {
			k = *m.PartitionKey
		}
		keys[k], ids[*m.MessageID] = true, true
	}
	if s.kinds.partitioned && len(keys) > 1 {
		return refuse(notAllowed(refusedMixed, s.entity))
	}
	if s.kinds.partitioned && s.kinds.dedup && len(ids) > 1 {
		return refuse(notAllowed(refusedMixedIDs, s.entity))
	}
	if ids[s.kinds.busyOn] {
		return errors.New("the service is busy")
	}
	s.sent = append(s.sent, msgs)
	return nil
}

func (s *strictSender) Close(context.Context) error { return nil }

// batches returns the ids of each batch taken, by message id "id-NNNN".
func (s *strictSender) batches() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][]string
	for _, b := range s.sent {
		var ids []string
		for _, m := range b {
			ids = append(ids, *m.MessageID)
		}
		out = append(out, ids)
	}
	return out
}

type namespaceOf struct {
	mu      sync.Mutex
	kinds   map[string]entityKinds
	senders map[string]*strictSender
}

func strictProducer(cfg Config, kinds map[string]entityKinds) (*Producer, *namespaceOf, *syncbuf.Buffer) {
	ns := &namespaceOf{kinds: kinds, senders: map[string]*strictSender{}}
	logs := &syncbuf.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	p := newProducer(cfg, func(entity string) (sender, error) {
		ns.mu.Lock()
		defer ns.mu.Unlock()
		s := &strictSender{entity: entity, kinds: ns.kinds[entity]}
		ns.senders[entity] = s
		return s, nil
	})
	return p, ns, logs
}

// keyed returns messages 1..len(keys) of topic, with those partition keys.
func keyed(topic string, keys ...string) []producer.Message {
	out := msgs(topic, len(keys), 10)
	for i, k := range keys {
		out[i].PartitionKey = k
	}
	return out
}

// A batch that mixes keys, cut before the producer knew the entity is
// partitioned, is refused whole; the producer cuts it again by key, sends the
// parts (those without a key first, then in the order of their first rows), and cuts the entity's later batches
// by key from the start. Every row goes once; each key's rows in their order.
// What it learnt is logged once.
func TestAMixedBatchOnAPartitionedEntityIsCutAgainByKey(t *testing.T) {
	t.Parallel()
	p, ns, logs := strictProducer(Config{}, map[string]entityKinds{"orders": {partitioned: true}})
	ctx := context.Background()
	in := keyed("orders", "a", "b", "a", "", "b")
	batches, err := p.Batches(ctx, "orders", in)
	require.NoError(t, err)
	require.Len(t, batches, 1, "nothing known yet: cut by size")
	require.NoError(t, p.Send(ctx, batches[0]))
	s := ns.senders["orders"]
	require.Equal(t, [][]string{{"id-0004"}, {"id-0001", "id-0003"}, {"id-0002", "id-0005"}}, s.batches(),
		"the rows without a key first, then each key's in the order of its first row")
	require.Equal(t, 1, s.refused)

	batches, err = p.Batches(ctx, "orders", keyed("orders", "a", "b", "a"))
	require.NoError(t, err)
	require.Len(t, batches, 2, "cut by key from now on")
	require.Equal(t, []int64{1, 3}, batches[0].IDs())
	require.Equal(t, []int64{2}, batches[1].IDs())
	for _, b := range batches {
		require.NoError(t, p.Send(ctx, b))
	}
	require.Equal(t, 1, s.refused, "no refusal once cut by key")
	require.Equal(t, 1, strings.Count(logs.String(), "cut one partition key a batch"), "learnt once, logged once")
	require.Contains(t, logs.String(), "Batching brokered messages with distinct SessionId or PartitionKey")
}

// When a later part of a batch cut again by key fails, the parts the entity
// took before it are named delivered: the sweeper sends them no more, where
// it once sent them again for duplicate detection, when on, to drop.
func TestAFailedPartNamesThePartsSentBeforeIt(t *testing.T) {
	t.Parallel()
	p, ns, _ := strictProducer(Config{}, map[string]entityKinds{"orders": {partitioned: true, busyOn: "id-0002"}})
	err := p.Send(context.Background(), producer.Batch{Topic: "orders", Messages: keyed("orders", "a", "b", "a", "", "b")})
	require.Error(t, err)
	require.Equal(t, producer.ClassTransient, producer.ClassOf(err), "%v", err)
	require.Equal(t, []int64{1, 3, 4}, producer.Delivered(err), "the parts without a key and of key a went before key b's failed")
	require.Equal(t, [][]string{{"id-0004"}, {"id-0001", "id-0003"}}, ns.senders["orders"].batches())
}

// A partitioned entity with duplicate detection refuses distinct message ids
// in one batch even under one key: the producer goes down to one message a
// batch, and every row still goes once, in order.
func TestDuplicateDetectionOnAPartitionedEntityGoesOneMessageABatch(t *testing.T) {
	t.Parallel()
	p, ns, logs := strictProducer(Config{}, map[string]entityKinds{"scans": {partitioned: true, dedup: true}})
	ctx := context.Background()
	require.NoError(t, p.Send(ctx, producer.Batch{Topic: "scans", Messages: keyed("scans", "a", "b", "a")}))
	require.Equal(t, [][]string{{"id-0001"}, {"id-0003"}, {"id-0002"}}, ns.senders["scans"].batches())
	require.Contains(t, logs.String(), "one message a batch")

	batches, err := p.Batches(ctx, "scans", keyed("scans", "a", "a", "a"))
	require.NoError(t, err)
	require.Len(t, batches, 3)
}

// --servicebus-batch-by-key cuts by key from the first batch: no refusal.
func TestBatchByKeyCutsByKeyFromTheStart(t *testing.T) {
	t.Parallel()
	p, ns, _ := strictProducer(Config{BatchByKey: true}, map[string]entityKinds{"orders": {partitioned: true}})
	ctx := context.Background()
	batches, err := p.Batches(ctx, "orders", keyed("orders", "a", "b", "a", "c"))
	require.NoError(t, err)
	require.Len(t, batches, 3)
	for _, b := range batches {
		require.NoError(t, p.Send(ctx, b))
	}
	require.Zero(t, ns.senders["orders"].refused)
}

// A session-enabled entity refuses a batch with a message without a session
// id: the rows without a partition key are named, message class, reason
// session_id_required; the entity is known to need sessions from then on, and
// Batches refuses such rows before sending.
func TestRowsWithoutAKeyOnASessionEntityAreNamed(t *testing.T) {
	t.Parallel()
	p, _, logs := strictProducer(Config{}, map[string]entityKinds{"chats": {sessions: true}})
	ctx := context.Background()
	err := p.Send(ctx, producer.Batch{Topic: "chats", Messages: keyed("chats", "a", "", "b", "")})
	require.Equal(t, producer.ClassMessage, producer.ClassOf(err), "%v", err)
	require.Equal(t, ReasonSessionIDRequired, producer.ReasonOf(err))
	require.Equal(t, []int64{2, 4}, producer.MessageIDs(err))
	require.ErrorContains(t, err, "requires sessions")
	require.Contains(t, logs.String(), "requires sessions")

	batches, err := p.Batches(ctx, "chats", keyed("chats", "a", ""))
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.Equal(t, ReasonSessionIDRequired, producer.ReasonOf(err))
	require.Len(t, batches, 1)
	require.Equal(t, []int64{1}, batches[0].IDs())
}

// The truly topic-level answers stay topic class; a not-allowed whose
// description the producer does not know trips the topic too, and is logged
// in full once, however many times it comes.
func TestTopicLevelAnswersAndUnknownRefusals(t *testing.T) {
	t.Parallel()
	p, _, logs := strictProducer(Config{}, map[string]entityKinds{})
	for _, tc := range []struct {
		err    error
		reason string
	}{
		{&amqp.Error{Condition: amqp.ErrCondNotFound, Description: "The messaging entity 'ns:topic:x' could not be found."}, "not_found"},
		{&amqp.Error{Condition: "com.microsoft:entity-disabled", Description: "Messaging entity 'ns:topic:x' is currently disabled."}, "entity_disabled"},
		{&amqp.Error{Condition: amqp.ErrCondUnauthorizedAccess, Description: "Unauthorized access. 'Send' claim(s) are required."}, "unauthorized"},
		{&amqp.Error{Condition: amqp.ErrCondResourceLimitExceeded, Description: "The maximum entity size has been reached or exceeded for Topic: 'x'."}, "entity_full"},
	} {
		err := classify(tc.err)
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", tc.err)
		require.Equal(t, tc.reason, producer.ReasonOf(err))
	}

	ns := map[string]*fakeSender{}
	p.newSender = func(entity string) (sender, error) {
		s := &fakeSender{entity: entity, maxBytes: 1 << 20}
		ns[entity] = s
		return s, nil
	}
	ctx := context.Background()
	for i := range 3 {
		b := producer.Batch{Topic: "odd", Messages: keyed("odd", "a")}
		_, _ = p.sender("odd")
		ns["odd"].sendErr = &amqp.Error{Condition: amqp.ErrCondNotAllowed,
			Description: fmt.Sprintf("Something new the service says. Reference:%d, TrackingId:t%d, Timestamp:now", i, i)}
		err := p.Send(ctx, b)
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err))
		require.Equal(t, "not_allowed", producer.ReasonOf(err))
	}
	require.Equal(t, 1, strings.Count(logs.String(), "a description this producer does not know"))
	require.Contains(t, logs.String(), "Something new the service says")
}

// Through the sweeper and a real outbox: on a session-enabled, partitioned
// entity a row without a key is dead-lettered as session_id_required while its
// neighbours, of several keys, are each delivered once; a topic whose entity
// does not exist trips.
func TestSweeperOnSessionAndPartitionedEntities(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	var rows []outbox.Message
	for i, k := range []string{"a", "b", "", "a", "c", "b"} {
		rows = append(rows, outbox.Message{Topic: "chats", PartitionKey: k, Payload: fmt.Appendf(nil, "m%d", i+1)})
	}
	rows = append(rows, outbox.Message{Topic: "missing", Payload: []byte("x")})
	require.NoError(t, pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error { return w.Write(ctx, tx, rows...) }))

	p, ns, _ := strictProducer(Config{}, map[string]entityKinds{"chats": {partitioned: true, sessions: true}, "missing": {notFound: true}})
	topics := breaker.New(breaker.Settings{})
	s, err := outbox.NewSweeper(dbtest.Pool(t), p, outbox.Config{Table: tbl, TopicBreaker: topics, TopicBackoffMax: -1,
		Retry: breaker.Retry{Attempts: 1}})
	require.NoError(t, err)
	for range 3 { // the refusal of the first batch, the resend of the rest, and nothing left
		_, err := s.Sweep(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, breaker.StateTripped, topics.State("missing"))

	var payloads []string
	for _, b := range ns.senders["chats"].sent {
		for _, m := range b {
			payloads = append(payloads, string(m.Body)+"/"+*m.SessionID)
		}
	}
	require.ElementsMatch(t, []string{"m1/a", "m2/b", "m4/a", "m5/c", "m6/b"}, payloads, "each keyed row once")
	byKey := map[string][]string{}
	for _, x := range payloads {
		body, key, _ := strings.Cut(x, "/")
		byKey[key] = append(byKey[key], body)
	}
	require.Equal(t, map[string][]string{"a": {"m1", "m4"}, "b": {"m2", "m6"}, "c": {"m5"}}, byKey, "each key's rows in their order")
	var reason string
	var id int64
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, fmt.Sprintf(`SELECT id, reason FROM %s`, tbl.DeadLetterIdent())).Scan(&id, &reason))
	require.Equal(t, int64(3), id)
	require.Equal(t, ReasonSessionIDRequired, reason)
	var outstanding int
	require.NoError(t, dbtest.Pool(t).QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE dispatched_at IS NULL`, tbl.Ident())).Scan(&outstanding))
	require.Equal(t, 1, outstanding, "the missing entity's row waits")
}

// Batches cut by size before the producer learnt (the rest of a page) are
// refused as mixed too: each is cut again by key, and the entity stays cut by
// key, not one message a batch.
func TestBatchesCutBeforeTheProducerLearntStayCutByKey(t *testing.T) {
	t.Parallel()
	p, ns, logs := strictProducer(Config{MaxBatch: 2}, map[string]entityKinds{"orders": {partitioned: true}})
	ctx := context.Background()
	batches, err := p.Batches(ctx, "orders", keyed("orders", "a", "b", "a", "b"))
	require.NoError(t, err)
	require.Len(t, batches, 2)
	for _, b := range batches {
		require.NoError(t, p.Send(ctx, b))
	}
	require.Equal(t, [][]string{{"id-0001"}, {"id-0002"}, {"id-0003"}, {"id-0004"}}, ns.senders["orders"].batches())
	require.NotContains(t, logs.String(), "one message a batch")
	batches, err = p.Batches(ctx, "orders", keyed("orders", "a", "b", "a", "b"))
	require.NoError(t, err)
	require.Len(t, batches, 2, "by key, two a batch")
}

// On an entity both partitioned and session-enabled, where the mixed batch is
// reported before the missing session id, the rows without a key are sent
// first, refused, and named: nothing else of the batch has gone, so its rest,
// sent again, goes once.
func TestOnAPartitionedSessionEntityNothingGoesTwice(t *testing.T) {
	t.Parallel()
	p, ns, _ := strictProducer(Config{}, map[string]entityKinds{"chats": {partitioned: true, sessions: true, mixedFirst: true}})
	ctx := context.Background()
	err := p.Send(ctx, producer.Batch{Topic: "chats", Messages: keyed("chats", "a", "", "b", "a")})
	require.Equal(t, ReasonSessionIDRequired, producer.ReasonOf(err), "%v", err)
	require.Equal(t, []int64{2}, producer.MessageIDs(err))
	require.Empty(t, ns.senders["chats"].batches(), "nothing went before the refusal")
	rest := keyed("chats", "a", "", "b", "a")
	require.NoError(t, p.Send(ctx, producer.Batch{Topic: "chats", Messages: []producer.Message{rest[0], rest[2], rest[3]}}))
	require.Equal(t, [][]string{{"id-0001", "id-0004"}, {"id-0003"}}, ns.senders["chats"].batches())
}

// A "SessionId was not set" refusal of a batch whose rows all have a key
// names no row: it is not the rows' fault, and stays the topic's.
func TestASessionRefusalWithEveryRowKeyedIsTheTopics(t *testing.T) {
	t.Parallel()
	b := setup(1<<20, 100)
	ctx := context.Background()
	_, err := b.p.Batches(ctx, "chats", keyed("chats", "a", "b"))
	require.NoError(t, err)
	b.senders["chats"].sendErr = notAllowed(refusedNoSession, "chats")
	err = b.p.Send(ctx, producer.Batch{Topic: "chats", Messages: keyed("chats", "a", "b")})
	require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
	require.Equal(t, "not_allowed", producer.ReasonOf(err))
	require.Empty(t, producer.MessageIDs(err))
}
