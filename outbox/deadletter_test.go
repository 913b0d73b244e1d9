package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// A row that always fails with a transient error, alone, while the broker is
// up, is dead-lettered after exactly --max-attempts attempts, payload
// byte-identical; its neighbours before and after it are delivered.
func TestRowFailingTransientlyIsDeadLetteredAtMaxAttempts(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	msgs := topicMessages("A", 3)
	msgs[1].Payload = []byte{0, 0xff, 'p', 'o', 'i', 's', 'o', 'n'}
	writeMessages(t, tbl, msgs...)
	writeMessages(t, tbl, topicMessages("B", 1)...) // another topic succeeds: failures count against A
	prod := memory.New(memory.Config{MaxBatch: 1})
	prod.FailMessage(2, errors.New("connection reset")) // transient, on row 2 only
	// A high threshold keeps the topic breaker from stopping A between tries.
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 3, Retry: once, TopicBackoffMax: -1,
		TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	for tick := 1; tick <= 3; tick++ {
		res, err := s.Sweep(context.Background())
		require.NoError(t, err)
		require.Equal(t, tick == 3, res.DeadLettered == 1, "tick %d", tick)
		writeMessages(t, tbl, topicMessages("B", 1)...)
	}
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 1)
	require.Equal(t, int64(2), dead[0].ID)
	require.Equal(t, outbox.ReasonMaxRetriesExceeded, dead[0].Reason)
	require.Equal(t, 3, dead[0].Attempts)
	require.Equal(t, []byte{0, 0xff, 'p', 'o', 'i', 's', 'o', 'n'}, dead[0].Payload, "byte-identical")
	require.Contains(t, dead[0].Error, "connection reset")

	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, dbtest.Outstanding(t, tbl))
	var aDelivered []int64
	for _, m := range prod.Messages() {
		if m.Topic == "A" {
			aDelivered = append(aDelivered, m.ID)
		}
	}
	require.Equal(t, []int64{1, 3}, aDelivered, "the neighbours before and after it")
}

// A message-class error on one message of a 100-message batch dead-letters
// that one and delivers the other 99.
func TestOneBadMessageOfAHundred(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 100)...)
	prod := memory.New(memory.Config{MaxBatch: 100})
	prod.FailMessage(42, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("too large")))
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 99, res.Dispatched)
	require.Equal(t, 1, res.DeadLettered)
	require.Len(t, prod.Messages(), 99)
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 1)
	require.Equal(t, int64(42), dead[0].ID)
}

// A broker with per-message acknowledgements (NATS, Kafka's partitions)
// takes the rows before a refused one and says so: the refused row is
// dead-lettered, and every other row is sent exactly once; the ones it took
// are not sent again (issue 34: 39 good rows were published twice).
func TestARefusalMidBatchSendsNoRowTwice(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 40)...)
	prod := memory.New(memory.Config{MaxBatch: 100, Partial: true})
	prod.FailMessage(20, producer.NewMessageError(producer.ReasonMessageTooLarge, nil, errors.New("too large")))
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 39, res.Dispatched)
	require.Equal(t, 1, res.DeadLettered)
	var ids []int64
	for _, m := range prod.Messages() {
		ids = append(ids, m.ID)
	}
	want := slices.DeleteFunc(seq(1, 40), func(id int64) bool { return id == 20 })
	require.Equal(t, want, ids, "every good row once, in order")
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 1)
	require.Equal(t, int64(20), dead[0].ID)
	require.Zero(t, dbtest.Outstanding(t, tbl))
}

// takesHalf is a broker that takes the first half of a batch, then fails
// the rest with a transient error that says so, once.
type takesHalf struct {
	*memory.Producer
	failed atomic.Bool
}

func (p *takesHalf) Send(ctx context.Context, b producer.Batch) error {
	if len(b.Messages) < 2 || p.failed.Swap(true) {
		return p.Producer.Send(ctx, b)
	}
	half := producer.Batch{Topic: b.Topic, Messages: b.Messages[:len(b.Messages)/2]}
	if err := p.Producer.Send(ctx, half); err != nil {
		return err
	}
	return producer.WithDelivered(producer.NewTransientError("timeout", errors.New("no acknowledgement for the rest")), half.IDs())
}

// A transient failure after the broker took part of a batch: the part is
// sent, and only the rest is sent again (no health check needed: the broker
// just took rows), with no attempt charged to anyone.
// With in-call retries, the retry sends the rest alone; without, the
// sweeper's split does.
func TestATransientFailureAfterAPartialDeliveryResendsOnlyTheRest(t *testing.T) {
	t.Parallel()
	for _, tries := range []int{1, 3} {
		t.Run(fmt.Sprintf("tries=%d", tries), func(t *testing.T) {
			t.Parallel()
			tbl := dbtest.Table(t)
			writeMessages(t, tbl, topicMessages("A", 10)...)
			prod := &takesHalf{Producer: memory.New(memory.Config{MaxBatch: 100})}
			s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl,
				Retry: breaker.Retry{Attempts: tries, Initial: time.Millisecond, Max: time.Millisecond}})
			res, err := s.Sweep(context.Background())
			require.NoError(t, err)
			var ids []int64
			for _, m := range prod.Messages() {
				ids = append(ids, m.ID)
			}
			require.Equal(t, seq(1, 10), ids, "every row once, in order")
			require.Equal(t, 10, res.Dispatched)
			require.Zero(t, res.AttemptedRows)
			require.Zero(t, dbtest.Outstanding(t, tbl))
		})
	}
}

// seq returns the ids from to to.
func seq(from, to int64) []int64 {
	var out []int64
	for id := from; id <= to; id++ {
		out = append(out, id)
	}
	return out
}

// Topic-class failures never dead-letter, however many attempts the rows have.
func TestTopicFailuresNeverDeadLetter(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 2)...)
	prod := memory.New(memory.Config{})
	prod.FailTopic("A", producer.NewTopicError("not_found", errors.New("no entity")))
	b := breaker.New(breaker.Settings{})
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 1, TopicBreaker: b})
	for range 3 {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
		b.Reset("A")
	}
	require.Empty(t, readDeadLetters(t, tbl))
	require.Equal(t, 2, dbtest.Outstanding(t, tbl))
}

type alerts struct{ got []alert.Alert }

func (a *alerts) Alert(_ context.Context, al alert.Alert) error {
	a.got = append(a.got, al)
	return nil
}

// storming returns a sweeper, alerting to al, of a table of 30 rows of topic
// A that its producer rejects every one of, with a dead-letter limit of 10.
func storming(t *testing.T, al alert.Alerter) (outbox.Table, *outbox.Sweeper) {
	t.Helper()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 30)...)
	prod := memory.New(memory.Config{MaxBatch: 5})
	for id := int64(1); id <= 30; id++ {
		prod.FailMessage(id, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("rejected")))
	}
	return tbl, newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, DeadLetterLimit: 10, Alerter: al})
}

// The storm guard: a producer that rejects every message of a topic as
// message-class stops dead-lettering at the limit, trips the topic and alerts;
// the remaining rows stay outstanding.
func TestDeadLetterStormGuard(t *testing.T) {
	t.Parallel()
	al := &alerts{}
	tbl, s := storming(t, al)
	res, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, 10, res.DeadLettered, "dead-lettering stops at the limit")
	require.Len(t, readDeadLetters(t, tbl), 10)
	require.Equal(t, 20, dbtest.Outstanding(t, tbl), "the rest stay outstanding")
	require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("A"))
	require.Len(t, al.got, 1)
	require.Equal(t, "critical", al.got[0].Severity)
	require.Contains(t, al.got[0].Summary, `dead-letter storm on topic "A"`)
}

// Dead-lettering is one statement: when it fails midway (here the insert into
// the dead-letter table breaks a constraint), the transaction rolls back and
// the row is still in the outbox, in exactly one table.
func TestDeadLetteringIsAtomic(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 1)...)
	_, err := dbtest.Pool(t).Exec(context.Background(), fmt.Sprintf(
		"ALTER TABLE %s ADD CONSTRAINT refuse_all CHECK (reason = 'never')", pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()))
	require.NoError(t, err)
	prod := memory.New(memory.Config{})
	prod.FailMessage(1, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("bad")))
	_, err = newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.ErrorContains(t, err, "refuse_all")
	require.Empty(t, readDeadLetters(t, tbl))
	rows := readRows(t, tbl)
	require.Len(t, rows, 1, "still in the outbox")
	require.False(t, rows[0].Dispatched)
}

// deadLetterAll dead-letters every row of tbl through the sweeper (the producer
// rejects them all as invalid) and returns the operator's view.
func deadLetterAll(t *testing.T, tbl outbox.Table, msgs ...outbox.Message) *outbox.DeadLetters {
	t.Helper()
	writeMessages(t, tbl, msgs...)
	prod := memory.New(memory.Config{})
	for _, r := range readRows(t, tbl) {
		prod.FailMessage(r.ID, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("schema mismatch")))
	}
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, len(msgs), res.DeadLettered)
	d, err := outbox.NewDeadLetters(dbtest.Pool(t), tbl)
	require.NoError(t, err)
	return d
}

func TestListDeadLettersFiltersAndHidesPayloads(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	d := deadLetterAll(t, tbl, append(topicMessages("A", 2), topicMessages("B", 1)...)...)
	ctx := context.Background()

	all, err := d.List(ctx, outbox.DeadLetterFilter{}, 50, false)
	require.NoError(t, err)
	require.Len(t, all, 3)
	for _, x := range all {
		require.Nil(t, x.Payload, "no payload unless asked")
		require.Nil(t, x.Headers)
		require.Equal(t, producer.ReasonInvalidMessage, x.Reason)
		require.NotNil(t, x.CorrelationID)
	}
	b, err := d.List(ctx, outbox.DeadLetterFilter{Topic: "B"}, 50, true)
	require.NoError(t, err)
	require.Len(t, b, 1)
	require.Equal(t, []byte("B-0"), b[0].Payload)
	none, err := d.List(ctx, outbox.DeadLetterFilter{Reason: producer.ReasonMessageTooLarge}, 50, false)
	require.NoError(t, err)
	require.Empty(t, none)
	one, err := d.List(ctx, outbox.DeadLetterFilter{}, 1, false)
	require.NoError(t, err)
	require.Len(t, one, 1)
}

// Replay by id and by filter restores the rows with their message_id, and they
// are delivered; replaying an id that is not there says so and changes nothing.
func TestReplayDeadLetters(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	d := deadLetterAll(t, tbl, append(topicMessages("A", 2), topicMessages("B", 2)...)...)
	ctx := context.Background()
	before, err := d.List(ctx, outbox.DeadLetterFilter{}, 50, false)
	require.NoError(t, err)
	messageIDs := map[int64]string{}
	for _, x := range before {
		messageIDs[x.ID] = x.MessageID
	}

	_, err = d.Replay(ctx, outbox.DeadLetterFilter{IDs: []int64{1, 999}})
	require.ErrorContains(t, err, "no dead letters with ids [999] in "+tbl.Schema+"."+tbl.DeadLetterName())
	left, _ := d.List(ctx, outbox.DeadLetterFilter{}, 50, false)
	require.Len(t, left, 4, "nothing replayed")
	// A dead letter the selection's other conditions leave out is told
	// from one that does not exist.
	_, err = d.Replay(ctx, outbox.DeadLetterFilter{IDs: []int64{2, 3, 999}, Topic: "A"})
	require.ErrorContains(t, err, "no dead letters with ids [999] in "+tbl.Schema+"."+tbl.DeadLetterName()+
		"; the dead letters with ids [3] in "+tbl.Schema+"."+tbl.DeadLetterName()+" do not match the selection's topic, reason or time: nothing replayed")
	left, _ = d.List(ctx, outbox.DeadLetterFilter{}, 50, false)
	require.Len(t, left, 4, "nothing replayed")

	_, err = d.Replay(ctx, outbox.DeadLetterFilter{})
	require.ErrorIs(t, err, outbox.ErrNoFilter)

	n, err := d.Replay(ctx, outbox.DeadLetterFilter{IDs: []int64{1}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = d.Replay(ctx, outbox.DeadLetterFilter{Topic: "B"})
	require.NoError(t, err)
	require.Equal(t, 2, n)

	rows := readRows(t, tbl)
	require.Len(t, rows, 3)
	got := map[string]bool{}
	for _, r := range rows {
		require.Zero(t, r.Attempts)
		require.False(t, r.Dispatched)
		got[r.MessageID] = true
	}
	for _, id := range []int64{1, 3, 4} {
		require.True(t, got[messageIDs[id]], "dead letter %d came back with its message id", id)
	}
	prod := memory.New(memory.Config{})
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Dispatched)

	n, err = d.Replay(ctx, outbox.DeadLetterFilter{All: true})
	require.NoError(t, err)
	require.Equal(t, 1, n, "all: the one left")
}

// Purge removes only the rows older than the cut; a dry run removes none.
func TestPurgeDeadLetters(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	d := deadLetterAll(t, tbl, topicMessages("A", 4)...)
	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, fmt.Sprintf("UPDATE %s SET dead_lettered_at = now() - interval '40 days' WHERE id <= 2",
		pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()))
	require.NoError(t, err)

	cut := outbox.DeadLetterFilter{Before: time.Now().Add(-720 * time.Hour)}
	n, err := d.Purge(ctx, cut, true)
	require.NoError(t, err)
	require.Equal(t, 2, n, "the dry run counts")
	require.Len(t, readDeadLetters(t, tbl), 4, "and deletes nothing")
	n, err = d.Purge(ctx, cut, false)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	left := readDeadLetters(t, tbl)
	require.Len(t, left, 2)
	require.Equal(t, int64(3), left[0].ID, "only the older rows went")
	_, err = d.Purge(ctx, outbox.DeadLetterFilter{}, false)
	require.ErrorIs(t, err, outbox.ErrNoFilter)
}

// rejectingBatches rejects some rows already when cutting batches, as a
// producer's own size check does.
type rejectingBatches struct {
	*memory.Producer
	reject map[int64]bool
}

func (r rejectingBatches) Batches(ctx context.Context, topic string, msgs []producer.Message) ([]producer.Batch, error) {
	var keep []producer.Message
	var bad []int64
	for _, m := range msgs {
		if r.reject[m.ID] {
			bad = append(bad, m.ID)
		} else {
			keep = append(keep, m)
		}
	}
	batches, _ := r.Producer.Batches(ctx, topic, keep)
	if len(bad) > 0 {
		return batches, producer.NewMessageError(producer.ReasonMessageTooLarge, bad, errors.New("over the size limit"))
	}
	return batches, nil
}

// The storm guard holds also for rows rejected while cutting batches, and for
// rows reaching --max-attempts.
func TestStormGuardCoversEveryDeadLetterPath(t *testing.T) {
	t.Parallel()
	t.Run("rejected while cutting batches", func(t *testing.T) {
		t.Parallel()
		tbl := dbtest.Table(t)
		writeMessages(t, tbl, topicMessages("A", 10)...)
		p := rejectingBatches{memory.New(memory.Config{}), map[int64]bool{2: true, 4: true, 6: true, 8: true, 10: true}}
		al := &alerts{}
		s := newSweeper(t, dbtest.Pool(t), p, outbox.Config{Table: tbl, DeadLetterLimit: 2, Alerter: al})
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
		require.Empty(t, readDeadLetters(t, tbl))
		require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("A"))
		require.Len(t, al.got, 1)
		require.Equal(t, 10, dbtest.Outstanding(t, tbl), "nothing of A sent past the rejected rows")
	})
	t.Run("max attempts", func(t *testing.T) {
		t.Parallel()
		tbl := dbtest.Table(t)
		writeMessages(t, tbl, topicMessages("A", 10)...)
		prod := memory.New(memory.Config{})
		prod.FailTopic("A", errors.New("misread broker error"))
		al := &alerts{}
		// Unordered, the split sends every row alone, and each fails alone.
		s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, MaxAttempts: 1, DeadLetterLimit: 2, Alerter: al,
			Ordering: outbox.OrderingNone, Retry: once})
		res, err := s.Sweep(context.Background())
		require.NoError(t, err)
		require.Equal(t, 2, res.DeadLettered, "up to the limit")
		require.Len(t, readDeadLetters(t, tbl), 2)
		require.Equal(t, 8, dbtest.Outstanding(t, tbl))
		require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("A"))
		require.Len(t, al.got, 1)
	})
}

// A broker's error text or a dead-letter reason holding bytes Postgres will
// not take in a text column (a NUL, invalid UTF-8) is written with those
// bytes replaced: its refusal once rolled back the page, and with it every
// batch the broker had taken, sent again at every sweep while the failing
// row never counted its attempt.
func TestErrorTextsPostgresWouldRefuseAreWrittenReplaced(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 10)...)
	prod := memory.New(memory.Config{MaxBatch: 10})
	prod.FailMessage(5, errors.New("broker said \x00\xff\xfe no")) // transient, row 5 alone
	prod.FailMessage(8, producer.NewMessageError("bad\xffreason", []int64{8}, errors.New("refused \x00 it")))
	s := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl, Retry: once, TopicBackoffMax: -1,
		Ordering: outbox.OrderingNone, TopicBreaker: breaker.New(breaker.Settings{FailureThreshold: 1000})})
	for range 3 {
		_, err := s.Sweep(context.Background())
		require.NoError(t, err)
	}
	sent := map[int64]int{}
	for _, m := range prod.Messages() {
		sent[m.ID]++
	}
	for id := int64(1); id <= 10; id++ {
		switch id {
		case 5, 8:
			require.Zero(t, sent[id], "row %d", id)
		default:
			require.Equal(t, 1, sent[id], "row %d is sent once, not again at each sweep", id)
		}
	}
	var left []row
	for _, r := range readRows(t, tbl) {
		if !r.Dispatched {
			left = append(left, r)
		}
	}
	require.Len(t, left, 1)
	require.Equal(t, int64(5), left[0].ID)
	require.Equal(t, 3, left[0].Attempts, "an attempt a sweep")
	require.NotNil(t, left[0].LastError)
	require.Equal(t, "broker said \uFFFD\uFFFD no", *left[0].LastError)
	dead := readDeadLetters(t, tbl)
	require.Len(t, dead, 1)
	require.Equal(t, int64(8), dead[0].ID)
	require.Equal(t, "bad\uFFFDreason", dead[0].Reason)
	require.Contains(t, dead[0].Error, "refused \uFFFD it")
}

// Each storm is posted, through the notifier too: a second storm of a topic
// after its reset, within the repeat interval, once counted as a repeat of
// the first and never posted.
func TestEveryStormIsPostedThroughTheNotifier(t *testing.T) {
	t.Parallel()
	al := &alerts{}
	n := alert.NewNotifier(al, alert.NotifierConfig{RepeatInterval: 4 * time.Hour})
	_, s := storming(t, n)
	_, err := s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("A"))
	s.TopicBreaker().Reset("A")
	_, err = s.Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, breaker.StateTripped, s.TopicBreaker().State("A"), "it storms again")
	n.Close(context.Background())
	storms := 0
	for _, a := range al.got {
		if a.Component == "dead-letter-storm-guard" {
			storms++
		}
	}
	require.Equal(t, 2, storms)
}
