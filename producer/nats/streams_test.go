package nats_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/producer"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/producertest"
)

func TestStreamSubjectsMatchAsJetStreamCapturesThem(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		filter, subject string
		want            bool
	}{
		{"orders", "orders", true},
		{"orders", "orders.eu", false},
		{"orders.*", "orders.eu", true},
		{"orders.*", "orders", false},
		{"orders.*", "orders.eu.paris", false},
		{"orders.>", "orders.eu.paris", true},
		{"orders.>", "orders", false},
		{"*.eu.>", "orders.eu.paris", true},
		{"*.eu.>", "orders.us.paris", false},
		{">", "anything.at.all", true},
		{"a.*.c", "a.b.c", true},
		{"a.*.c", "a.b.d", false},
	} {
		require.Equal(t, c.want, outboxnats.Matches(c.filter, c.subject), "%s captures %s", c.filter, c.subject)
	}
}

// A subject no stream captures is refused from the stream list, before
// anything is published: Batches (which never publishes) says so once the
// producer is connected, and Send publishes nothing.
func TestSubjectWithoutStreamIsRefusedWithoutAPublish(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{}, jetstream.StreamConfig{})
	missing := brokertest.Name("nostream")
	nc, err := natsgo.Connect(brokertest.NATSURL(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	sub, err := nc.SubscribeSync(missing + ".>")
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	ctx := context.Background()
	for i := range 100 {
		subj := fmt.Sprintf("%s.%d", missing, i)
		_, err := f.p.Batches(ctx, subj, producertest.Messages(subj, 1, 1))
		require.Equal(t, "no_stream", producer.ReasonOf(err), "%v", err)
		err = f.p.Send(ctx, producer.Batch{Topic: subj, Messages: producertest.Messages(subj, 1, 1)})
		require.Equal(t, producer.ClassTopic, producer.ClassOf(err), "%v", err)
		require.Equal(t, "no_stream", producer.ReasonOf(err))
	}
	// A marker on the producer's own connection comes after anything it
	// published before: it must be the first message the subscription sees.
	pc := outboxnats.Conn(f.p)
	require.NoError(t, pc.Publish(missing+".marker", []byte("marker")))
	require.NoError(t, pc.Flush())
	m, err := sub.NextMsg(30 * time.Second)
	require.NoError(t, err)
	require.Equal(t, missing+".marker", m.Subject, "the producer published to a subject no stream captures")

	// A subject a stream captures still goes.
	subj := f.subject("ok")
	require.NoError(t, f.p.Send(ctx, producer.Batch{Topic: subj, Messages: producertest.Messages(subj, 1, 2)}))
}

// A stream created after a subject was refused is seen at the next send once
// a second has passed since the list was read: a miss reads the list again.
func TestStreamCreatedLaterIsSeenAfterAMiss(t *testing.T) {
	t.Parallel()
	f := setup(t, outboxnats.Config{StreamsRefresh: time.Hour}, jetstream.StreamConfig{})
	var mu sync.Mutex
	now := time.Now()
	outboxnats.SetStreamsClock(f.p, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	later := brokertest.Name("later")
	subj := later + ".x"
	send := func() error {
		return f.p.Send(context.Background(), producer.Batch{Topic: subj, Messages: producertest.Messages(subj, 1, 1)})
	}
	require.Equal(t, "no_stream", producer.ReasonOf(send()))

	nc, err := natsgo.Connect(brokertest.NATSURL(t))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	brokertest.CreateStream(t, js, jetstream.StreamConfig{Name: later, Subjects: []string{later + ".>"}})
	require.Equal(t, "no_stream", producer.ReasonOf(send()), "within a second of the last read, the list stands")

	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	require.NoError(t, send())
}
