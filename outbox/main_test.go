package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// ignored is an outbox.Observer that ignores everything: a test's observer
// embeds it and overrides what it counts.
type ignored struct{}

func (ignored) BatchDispatched(string, int, []time.Duration) {}
func (ignored) BatchFailed(string, producer.Class)           {}
func (ignored) DeadLettered(string, int)                     {}
func (ignored) SweepDone(time.Duration)                      {}

// row is an outbox row as the tests read it back.
type row struct {
	ID           int64
	Topic        string
	Attempts     int
	LastError    *string
	Dispatched   bool
	MessageID    string
	Payload      []byte
	Headers      map[string]any
	ContentType  *string
	Correlation  *string
	PartitionKey *string
}

// readRows reads every row of tbl that is outstanding or dispatched: those of
// the outbox, and those the sweeper moved to its history table (Dispatched).
func readRows(t *testing.T, tbl outbox.Table) []row {
	t.Helper()
	const columns = `id, topic, attempts, last_error, dispatched_at IS NOT NULL, message_id::text, payload, headers,
		        content_type, correlation_id, partition_key`
	rows, err := dbtest.Pool(t).Query(context.Background(), fmt.Sprintf(
		`SELECT %s FROM %s UNION ALL SELECT %s FROM %s ORDER BY id`,
		columns, pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize(), columns, outbox.HistoryIdent(tbl)))
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.ID, &x.Topic, &x.Attempts, &x.LastError, &x.Dispatched, &x.MessageID, &x.Payload, &x.Headers,
			&x.ContentType, &x.Correlation, &x.PartitionKey)
		return x, err
	})
	require.NoError(t, err)
	return out
}

// writeMessages commits msgs in one transaction and returns nothing; ids ascend in
// the order given.
func writeMessages(t *testing.T, tbl outbox.Table, msgs ...outbox.Message) {
	t.Helper()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, dbtest.Pool(t), func(tx pgx.Tx) error {
		return w.Write(ctx, tx, msgs...)
	}))
}

func topicMessages(topic string, n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, "%s-%d", topic, i), CorrelationID: fmt.Sprintf("%s-%d", topic, i)}
	}
	return msgs
}

// deadLetter is a dead-letter row as the tests read it back.
type deadLetter struct {
	ID          int64
	MessageID   string
	Topic       string
	Payload     []byte
	Attempts    int
	Reason      string
	Error       string
	Correlation *string
}

func readDeadLetters(t *testing.T, tbl outbox.Table) []deadLetter {
	t.Helper()
	rows, err := dbtest.Pool(t).Query(context.Background(), fmt.Sprintf(
		`SELECT id, message_id::text, topic, payload, attempts, reason, coalesce(error, ''), correlation_id
		 FROM %s ORDER BY id`, pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()))
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (deadLetter, error) {
		var d deadLetter
		err := r.Scan(&d.ID, &d.MessageID, &d.Topic, &d.Payload, &d.Attempts, &d.Reason, &d.Error, &d.Correlation)
		return d, err
	})
	require.NoError(t, err)
	return out
}

// brokerBreaker returns a broker breaker for a sweeper's config, closed at
// cleanup.
func brokerBreaker(t testing.TB, cfg breaker.DependencyConfig) *breaker.Dependency {
	t.Helper()
	d := breaker.NewDependency(cfg)
	t.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

// failBroker judges n sends the broker's fault, as an outage would.
func failBroker(t testing.TB, d *breaker.Dependency, n int) {
	t.Helper()
	for range n {
		done, err := d.Allow()
		require.NoError(t, err)
		done(breaker.BrokerDown, refused)
	}
}

// refused is the failure of a broker that is down.
var refused = producer.NewBrokerError("connection_lost", errors.New("dial tcp 127.0.0.1:5672: connect: connection refused"))

// once is the sweeper's in-call retry turned off, so tests count sends.
var once = breaker.Retry{Attempts: 1}

// sweeps returns a function that runs one sweep of s and fails t if it
// fails, for tests that sweep by hand, step by step.
func sweeps(t testing.TB, s *outbox.Sweeper) func() outbox.SweepResult {
	return func() outbox.SweepResult {
		t.Helper()
		res, err := s.Sweep(context.Background())
		require.NoError(t, err)
		return res
	}
}

const (
	// patience bounds the tests' waits for what must come (a row delivered, a
	// breaker's change of state once its time is up): generous, since a busy
	// machine only makes them longer, and a wait ends as soon as it is met.
	patience = time.Minute
	// openWindow is the open duration of a broker breaker that a test must
	// still find open after the rest of the sweep that opened it and a few
	// queries: those take milliseconds, and this leaves room for a machine
	// hundreds of times slower. Tests that need the breaker half-open then
	// wait for it.
	openWindow = 3 * time.Second
)
