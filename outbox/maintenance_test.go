package outbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// Retention deletes only dispatched rows older than the window, never
// outstanding ones, in bounded batches; dead letters only with their own
// retention set.
func TestRetentionDeletesOnlyOldDispatchedRows(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 10)...)
	ctx := context.Background()
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	_, err := dbtest.Pool(t).Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() - interval '8 days' WHERE id <= 5")
	require.NoError(t, err)
	_, err = dbtest.Pool(t).Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() - interval '1 day' WHERE id IN (6, 7)")
	require.NoError(t, err)
	_, err = dbtest.Pool(t).Exec(ctx, "UPDATE "+ident+" SET created_at = now() - interval '30 days' WHERE id > 7") // old but outstanding
	require.NoError(t, err)

	r, err := outbox.NewRetention(dbtest.Pool(t), outbox.RetentionConfig{Table: tbl, Batch: 2})
	require.NoError(t, err)
	res, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, res.Dispatched, "in batches of 2 until done")
	var left []int64
	for _, row := range readRows(t, tbl) {
		left = append(left, row.ID)
	}
	require.Equal(t, []int64{6, 7, 8, 9, 10}, left)
}

func TestRetentionOfDeadLettersOnlyWhenSet(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	deadLetterAll(t, tbl, topicMessages("A", 3)...)
	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, "UPDATE "+pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()+
		" SET dead_lettered_at = now() - interval '40 days' WHERE id = 1")
	require.NoError(t, err)
	keep, err := outbox.NewRetention(dbtest.Pool(t), outbox.RetentionConfig{Table: tbl})
	require.NoError(t, err)
	res, err := keep.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, res.DeadLetters, "kept until purged by default")
	trim, err := outbox.NewRetention(dbtest.Pool(t), outbox.RetentionConfig{Table: tbl, DeadLetters: 720 * time.Hour})
	require.NoError(t, err)
	res, err = trim.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.DeadLetters)
	require.Len(t, readDeadLetters(t, tbl), 2)
}

// receiver is a local HTTP webhook receiver that can be made to fail.
type receiver struct {
	url    string
	mu     sync.Mutex
	bodies []string
	down   bool
}

// newProbe returns a probe of tbl alerting a receiver of the test's own.
func newProbe(t *testing.T, tbl outbox.Table, threshold int) (*outbox.Probe, *receiver) {
	t.Helper()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	rcv.url = srv.URL
	p, err := outbox.NewProbe(dbtest.Pool(t), outbox.ProbeConfig{Table: tbl, Threshold: threshold, Alerter: alert.Webhook{URL: srv.URL}})
	require.NoError(t, err)
	return p, rcv
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		http.Error(w, "receiver down", http.StatusServiceUnavailable)
		return
	}
	r.bodies = append(r.bodies, string(b))
}

func (r *receiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

func (r *receiver) setDown(down bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = down
}

// deadLetterMore dead-letters n more rows of topic whose payload and headers
// hold a marker that must never reach an alert.
func deadLetterMore(t *testing.T, tbl outbox.Table, from, n int) {
	t.Helper()
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: "orders", Payload: []byte("PAYLOAD-MARKER-secret"),
			Headers: map[string]any{"email": "HEADER-MARKER@example.com"}, CorrelationID: fmt.Sprintf("corr-%d", from+i)}
	}
	writeMessages(t, tbl, msgs...)
	prod := memory.New(memory.Config{})
	for _, r := range readRows(t, tbl) {
		prod.FailMessage(r.ID, producer.NewMessageError(producer.ReasonInvalidMessage, nil, errors.New("schema mismatch")))
	}
	res, err := newSweeper(t, dbtest.Pool(t), prod, outbox.Config{Table: tbl}).Sweep(context.Background())
	require.NoError(t, err)
	require.Equal(t, n, res.DeadLettered)
}

// The probe posts exactly one alert per growth, with correlation ids and
// reasons and no payload or header value; with the receiver down the alert is
// retried at the next probe.
func TestProbeAlertsOncePerGrowthWithoutPayloads(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	p, rcv := newProbe(t, tbl, 0)
	ctx := context.Background()
	probe := func() outbox.ProbeResult {
		res, err := p.RunOnce(ctx)
		require.NoError(t, err)
		return res
	}

	require.False(t, probe().Alerted, "no dead letters, no alert")
	deadLetterMore(t, tbl, 1, 2)
	require.True(t, probe().Alerted)
	require.False(t, probe().Alerted, "no growth, no second alert")
	require.Len(t, rcv.got(), 1)

	var a alert.Alert
	require.NoError(t, json.Unmarshal([]byte(rcv.got()[0]), &a))
	require.Equal(t, "critical", a.Severity)
	require.Equal(t, 2, a.Count)
	require.ElementsMatch(t, []string{"corr-1", "corr-2"}, a.CorrelationIDs)
	require.Equal(t, []string{producer.ReasonInvalidMessage}, a.Reasons)
	require.Equal(t, tbl.DeadLetterName(), a.Table)
	require.Contains(t, a.Action, "sweeper dlq list")
	require.False(t, a.Time.IsZero())

	rcv.setDown(true)
	deadLetterMore(t, tbl, 3, 1)
	require.False(t, probe().Alerted, "the post failed")
	rcv.setDown(false)
	require.True(t, probe().Alerted, "retried at the next probe")
	bodies := rcv.got()
	require.Len(t, bodies, 2)
	require.NoError(t, json.Unmarshal([]byte(bodies[1]), &a))
	require.Equal(t, 3, a.Count)
	require.Equal(t, []string{"corr-3"}, a.CorrelationIDs, "only the new rows")
	for _, b := range bodies {
		require.NotContains(t, b, "MARKER", "alerts never carry payloads or headers")
	}
}

// The watermark is the database's: a restarted sweeper, or another instance
// taking over the probe, does not alert again about dead letters already
// alerted, and does alert about the ones after them.
func TestProbeWatermarkSurvivesRestart(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	first, rcv := newProbe(t, tbl, 0)
	deadLetterMore(t, tbl, 1, 2)
	res, err := first.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, res.Alerted)

	restarted, err := outbox.NewProbe(dbtest.Pool(t), outbox.ProbeConfig{Table: tbl, Alerter: alert.Webhook{URL: rcv.url}})
	require.NoError(t, err)
	res, err = restarted.RunOnce(ctx)
	require.NoError(t, err)
	require.False(t, res.Alerted, "already alerted before the restart")
	require.Zero(t, res.New)
	require.Len(t, rcv.got(), 1)

	deadLetterMore(t, tbl, 3, 1)
	res, err = restarted.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, res.Alerted)
	require.Equal(t, 1, res.New)
	bodies := rcv.got()
	require.Len(t, bodies, 2)
	var a alert.Alert
	require.NoError(t, json.Unmarshal([]byte(bodies[1]), &a))
	require.Equal(t, []string{"corr-3"}, a.CorrelationIDs)
}

func TestProbeThresholdAndDatabaseOutage(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	p, rcv := newProbe(t, tbl, 2)
	deadLetterMore(t, tbl, 1, 1)
	res, err := p.RunOnce(context.Background())
	require.NoError(t, err)
	require.False(t, res.Alerted, "below the threshold")

	// A probe that cannot read the database alerts about that, once.
	broken, err := outbox.NewProbe(dbtest.Pool(t), outbox.ProbeConfig{Table: outbox.Table{Schema: "no_such_schema"},
		Alerter: alert.Webhook{URL: rcv.url}})
	require.NoError(t, err)
	for range 2 {
		_, err = broken.RunOnce(context.Background())
		require.Error(t, err)
	}
	bodies := rcv.got()
	require.Len(t, bodies, 1)
	require.True(t, strings.Contains(bodies[0], "cannot read"), bodies[0])
}

// New dead letters after a replay alert again, though the count did not grow.
func TestProbeSeesGrowthAfterReplay(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	p, rcv := newProbe(t, tbl, 0)
	ctx := context.Background()
	deadLetterMore(t, tbl, 1, 2)
	res, err := p.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, res.Alerted)

	d, err := outbox.NewDeadLetters(dbtest.Pool(t), tbl)
	require.NoError(t, err)
	_, err = d.Replay(ctx, outbox.DeadLetterFilter{All: true})
	require.NoError(t, err)
	_, err = dbtest.Pool(t).Exec(ctx, "DELETE FROM "+pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize())
	require.NoError(t, err)
	deadLetterMore(t, tbl, 3, 2)
	res, err = p.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Count, "the count is back where it was")
	require.True(t, res.Alerted, "but the rows are new")
	var a alert.Alert
	require.NoError(t, json.Unmarshal([]byte(rcv.got()[1]), &a))
	require.ElementsMatch(t, []string{"corr-3", "corr-4"}, a.CorrelationIDs)
}

// A run starts where the last one stopped (less a margin), so that it does not
// walk again the index entries of the rows deleted before, which a held
// vacuum horizon keeps; a row marked earlier than that, by a page transaction
// that committed late, waits for the hourly run that starts from the oldest.
func TestRetentionStartsWhereTheLastRunStopped(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	writeMessages(t, tbl, topicMessages("A", 10)...)
	ctx := context.Background()
	ident := pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()
	_, err := dbtest.Pool(t).Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() - interval '8 days' WHERE id <= 5")
	require.NoError(t, err)
	r, err := outbox.NewRetention(dbtest.Pool(t), outbox.RetentionConfig{Table: tbl, Batch: 2})
	require.NoError(t, err)
	res, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, res.Dispatched)

	_, err = dbtest.Pool(t).Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() - interval '9 days' WHERE id = 6")
	require.NoError(t, err)
	_, err = dbtest.Pool(t).Exec(ctx, "UPDATE "+ident+" SET dispatched_at = now() - interval '8 days' WHERE id = 7")
	require.NoError(t, err)
	res, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Dispatched, "row 7, after where the last run stopped; row 6 is before it")

	outbox.ForceFullRetention(r)
	res, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Dispatched, "the full run finds row 6")
	var left []int64
	for _, row := range readRows(t, tbl) {
		left = append(left, row.ID)
	}
	require.Equal(t, []int64{8, 9, 10}, left)
}

// Migration 9 sets the outbox's autovacuum to a hundredth of the table.
func TestMigrationSetsTheOutboxAutovacuum(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	var opts []string
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT reloptions FROM pg_class WHERE oid = $1::regclass",
		pgx.Identifier{tbl.Schema, tbl.Name}.Sanitize()).Scan(&opts))
	require.Subset(t, opts, []string{"autovacuum_vacuum_scale_factor=0.01", "autovacuum_analyze_scale_factor=0.01",
		"autovacuum_vacuum_threshold=1000"})
}

// A dead letter whose page committed after a probe, with a stamp from before
// it (the page moved it, then sent on for seconds), is growth all the same:
// the next probe alerts, once.
func TestProbeAlertsADeadLetterStampedBeforeItsWatermark(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	p, rcv := newProbe(t, tbl, 0)
	ctx := context.Background()
	deadLetterMore(t, tbl, 1, 2)
	res, err := p.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, res.Alerted)

	deadLetterMore(t, tbl, 3, 1)
	_, err = dbtest.Pool(t).Exec(ctx, fmt.Sprintf("UPDATE %s SET dead_lettered_at = dead_lettered_at - interval '1 hour' WHERE correlation_id = 'corr-3'",
		pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()))
	require.NoError(t, err)
	res, err = p.RunOnce(ctx)
	require.NoError(t, err)
	require.True(t, res.Alerted, "the count grew")
	require.Equal(t, 1, res.New)
	require.Equal(t, 3, res.Count)
	res, err = p.RunOnce(ctx)
	require.NoError(t, err)
	require.False(t, res.Alerted, "once")
	require.Len(t, rcv.got(), 2)
}

// Two instances probing in turn alert a growth once: the second sees the
// watermark the first moved, and takes the count without alerting it again,
// even a growth of rows stamped before the watermark.
func TestTwoInstancesAlertAGrowthOnce(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	a, rcv := newProbe(t, tbl, 0)
	b, err := outbox.NewProbe(dbtest.Pool(t), outbox.ProbeConfig{Table: tbl, Alerter: alert.Webhook{URL: rcv.url}})
	require.NoError(t, err)
	ctx := context.Background()
	run := func(p *outbox.Probe) outbox.ProbeResult {
		res, err := p.RunOnce(ctx)
		require.NoError(t, err)
		return res
	}
	deadLetterMore(t, tbl, 1, 2)
	require.True(t, run(a).Alerted)
	require.False(t, run(b).Alerted, "b takes the count a alerted")

	// A dead letter stamped before the watermark, committed after it.
	deadLetterMore(t, tbl, 3, 1)
	_, err = dbtest.Pool(t).Exec(ctx, fmt.Sprintf("UPDATE %s SET dead_lettered_at = dead_lettered_at - interval '1 hour' WHERE correlation_id = 'corr-3'",
		pgx.Identifier{tbl.Schema, tbl.DeadLetterName()}.Sanitize()))
	require.NoError(t, err)
	require.True(t, run(b).Alerted, "the growth")
	require.False(t, run(a).Alerted, "once: a sees the watermark b moved")
	require.False(t, run(b).Alerted)
	require.Len(t, rcv.got(), 2)
}
