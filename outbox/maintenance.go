package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-sweeper/sweeper/alert"

	"github.com/outbox-sweeper/sweeper/outbox/writer"
)

// Defaults for the maintenance services.
const (
	RetentionDefault           = 168 * time.Hour
	RetentionBatchDefault      = 1000
	DeadLetterThresholdDefault = 1
	maxAlertCorrelationIDs     = 20
)

// RetentionConfig configures a [Retention] cleaner.
type RetentionConfig struct {
	// Table names the outbox.
	Table Table
	// Dispatched is how long dispatched rows are kept. Defaults to
	// RetentionDefault; negative keeps them forever. It also sets the width
	// of the history table's partitions (a seventh of it, from 1s to a day;
	// partitions.go).
	Dispatched time.Duration
	// DeadLetters is how long dead letters are kept. Zero keeps them until an
	// operator purges them.
	DeadLetters time.Duration
	// Batch is the most rows one delete removes. Defaults to
	// RetentionBatchDefault.
	//
	// Ahead is how far past the current history partition each run makes
	// partitions ready: set it to at least the time between runs, or moves
	// land in the DEFAULT partition until the next run. Zero (and anything
	// less) means two partitions' width.
	Ahead time.Duration
	Batch int
	// Logger receives a line per run that deleted something.
	Logger *slog.Logger
}

// Retention retires dispatched rows, and optionally dead letters, past their
// retention. Dispatched rows live in the history table's partitions, which it
// creates ahead of time and drops whole once every row in them is past the
// retention (partitions.go); it empties the DEFAULT partition, and deletes the
// rows dispatched before the history table (schema version 10) that are still
// in the outbox, in bounded batches so no delete holds locks for long. Those
// are gone one retention period after the upgrade.
type Retention struct {
	cfg                  RetentionConfig
	pool                 *pgxpool.Pool
	lockKey              int64
	width                time.Duration
	deleteDispatched     string
	deleteDeadLetters    string
	historyPartitions    string
	historyDefaultSpan   string
	deleteHistoryDefault string

	// from is where the next run's delete of dispatched rows left in the
	// outbox (by sweepers before the history table) starts: the newest
	// dispatched_at the last one deleted, less retentionMargin, so that a
	// run does not walk again the index entries of rows deleted before
	// (delete_dispatched.sql). A row marked in a page transaction (of a
	// sweeper of the previous version, during a rolling upgrade) that began
	// before from and committed after the last run is left for the full run
	// every retentionFullEvery, which starts from the oldest.
	from, fullRun time.Time
}

// retentionMargin is how far before the last deleted row a run starts: page
// transactions of sweepers before the history table marked rows with their
// start time and commit after their sends,
// which take well under it.
const retentionMargin = 30 * time.Second

// retentionFullEvery is how often a run starts from the oldest dispatched row.
const retentionFullEvery = time.Hour

// NewRetention returns a cleaner for cfg.Table.
func NewRetention(pool *pgxpool.Pool, cfg RetentionConfig) (*Retention, error) {
	cfg.Table = cfg.Table.WithDefaults()
	if err := cfg.Table.Validate(); err != nil {
		return nil, err
	}
	if cfg.Dispatched == 0 {
		cfg.Dispatched = RetentionDefault
	}
	if cfg.Batch <= 0 {
		cfg.Batch = RetentionBatchDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := cfg.Table
	return &Retention{cfg: cfg, pool: pool, lockKey: writer.AdvisoryKey("outbox-sweeper retention " + t.String()),
		width: historyWidth(cfg.Dispatched), deleteDispatched: statement(t, "delete_dispatched"),
		deleteDeadLetters: statement(t, "delete_dead_letters"), historyPartitions: statement(t, "history_partitions"),
		historyDefaultSpan: statement(t, "history_default_span"), deleteHistoryDefault: statement(t, "delete_history_default")}, nil
}

// RetentionResult counts what one run did.
type RetentionResult struct {
	// Dispatched counts the dispatched rows deleted row by row: those left in
	// the outbox from before the history table, and those of the history's
	// DEFAULT partition. Rows of dropped partitions are not counted.
	Dispatched, DeadLetters int
	// PartitionsCreated and PartitionsDropped count the history partitions
	// made ahead and dropped past retention.
	PartitionsCreated, PartitionsDropped int
	// Skipped is set when another instance holds the run's lock.
	Skipped bool
}

// Prepare creates the history partitions the moves need now and soon (the
// current one and the next two). Call it before the sweeper starts: without
// them, sent rows land in the DEFAULT partition until the first run. While
// another instance holds retention's lock, Prepare waits for it (it makes
// the same partitions first), until ctx ends: a sweeper that started while
// the other made the current partition would move its rows into the DEFAULT
// partition meanwhile, and Postgres refuses such a move at its commit ("new
// row for relation …_default violates partition constraint"; the page's rows
// are sent again), as two instances of a relay of many outboxes, started
// together, found. It returns an error wrapping ErrNoHistory when the
// history table does not exist.
func (r *Retention) Prepare(ctx context.Context) error {
	for {
		skipped, err := r.locked(ctx, func(conn *pgx.Conn) error {
			_, err := r.ensurePartitions(ctx, conn)
			return err
		})
		if err == nil && skipped && !sleepUntil(ctx, time.Now().Add(prepareRetry)) {
			err = fmt.Errorf("another instance held retention's lock throughout: %w", ctx.Err())
		}
		if err != nil {
			return fmt.Errorf("prepare the history partitions of %s: %w", r.cfg.Table, err)
		}
		if !skipped {
			return nil
		}
	}
}

// prepareRetry is how often Prepare tries for the lock another instance holds.
const prepareRetry = 50 * time.Millisecond

// locked runs f on a connection holding retention's advisory lock, unless
// another instance holds it (skipped).
func (r *Retention) locked(ctx context.Context, f func(*pgx.Conn) error) (skipped bool, err error) {
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", r.lockKey).Scan(&locked); err != nil {
		return false, err
	}
	if !locked {
		return true, nil
	}
	defer func() {
		// The lock belongs to the session: a connection that could not give it
		// back must not return to the pool holding it, or retention would skip
		// for as long as that connection lives.
		var unlocked bool
		err := conn.QueryRow(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", r.lockKey).Scan(&unlocked)
		if err != nil || !unlocked {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()

	return false, f(conn.Conn())
}

// RunOnce creates the history partitions ahead, drops those past retention
// and deletes the rest of what is past retention, batch after batch, unless
// another sweeper instance is running retention on the same table right now
// (one instance is enough; an advisory lock decides).
func (r *Retention) RunOnce(ctx context.Context) (RetentionResult, error) {
	var res RetentionResult
	skipped, err := r.locked(ctx, func(conn *pgx.Conn) error {
		// Each step is tried whatever the others did: a partition that
		// cannot be made (a hand-made one in the way) once stopped every
		// drop and delete after it, run after run, and history and dead
		// letters grew without bound behind one logged error.
		var errs []error
		var err error
		if res.PartitionsCreated, err = r.ensurePartitions(ctx, conn); err != nil {
			errs = append(errs, err)
		}
		if r.cfg.Dispatched > 0 {
			var inDefault int
			if res.PartitionsDropped, inDefault, err = r.dropPartitions(ctx, conn); err != nil {
				errs = append(errs, err)
			}
			res.Dispatched += inDefault
			legacy, err := r.deleteDispatchedRows(ctx, conn)
			res.Dispatched += legacy
			if err != nil {
				errs = append(errs, fmt.Errorf("delete dispatched rows older than %s: %w", r.cfg.Dispatched, err))
			}
		}
		if r.cfg.DeadLetters > 0 {
			if res.DeadLetters, err = r.deleteAll(ctx, conn, r.deleteDeadLetters, r.cfg.DeadLetters); err != nil {
				errs = append(errs, fmt.Errorf("delete dead letters older than %s: %w", r.cfg.DeadLetters, err))
			}
		}
		return errors.Join(errs...)
	})
	res.Skipped = skipped
	if err != nil {
		return res, fmt.Errorf("retention of %s: %w", r.cfg.Table, err)
	}
	if res.Dispatched+res.DeadLetters+res.PartitionsCreated+res.PartitionsDropped > 0 {
		r.cfg.Logger.Info("retention", "table", r.cfg.Table.String(), "dispatched_deleted", res.Dispatched, "dead_letters_deleted", res.DeadLetters,
			"partitions_created", res.PartitionsCreated, "partitions_dropped", res.PartitionsDropped)
	}
	return res, nil
}

// deleteDispatchedRows runs delete_dispatched.sql until it deletes less than a
// batch, from where the last run stopped (from), or from the oldest row once
// every retentionFullEvery.
func (r *Retention) deleteDispatchedRows(ctx context.Context, conn *pgx.Conn) (int, error) {
	from := r.from
	if time.Since(r.fullRun) >= retentionFullEvery {
		from = time.Time{}
		r.fullRun = time.Now()
	}
	total := 0
	for {
		var (
			n      int
			newest *time.Time
		)
		if err := conn.QueryRow(ctx, r.deleteDispatched, r.cfg.Dispatched, r.cfg.Batch, from).Scan(&n, &newest); err != nil {
			return total, err
		}
		total += n
		if newest != nil {
			from = newest.Add(-retentionMargin)
			if from.After(r.from) {
				r.from = from
			}
		}
		if n < r.cfg.Batch || ctx.Err() != nil {
			return total, nil
		}
	}
}

// deleteAll runs a bounded delete until it deletes less than a batch.
func (r *Retention) deleteAll(ctx context.Context, conn *pgx.Conn, stmt string, age time.Duration) (int, error) {
	total := 0
	for {
		tag, err := conn.Exec(ctx, stmt, age, r.cfg.Batch)
		if err != nil {
			return total, err
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < int64(r.cfg.Batch) || ctx.Err() != nil {
			return total, nil
		}
	}
}

// ProbeConfig configures a dead-letter [Probe].
type ProbeConfig struct {
	// Table names the outbox.
	Table Table
	// Threshold is the dead-letter count at which the probe alerts. Defaults
	// to DeadLetterThresholdDefault.
	Threshold int
	// Alerter receives the alerts. Required.
	Alerter alert.Alerter
	// Logger receives failed posts.
	Logger *slog.Logger
}

// Probe watches the dead-letter table and alerts when it holds at least
// Threshold rows and has rows dead-lettered after the last alert that went out
// (or more rows than it held at this process's last probe, for those stamped
// before that probe and committed after it):
// one alert per growth (a replay or purge in between does not hide new rows),
// naming the count and the new rows' correlation ids and reasons, never their
// payloads. A post that fails is retried at the next run. A run that cannot
// read the database alerts about that instead, once per outage.
//
// The watermark lives in the database (<table>_probe), read and moved in the
// transaction that holds the probe's advisory lock, the alert posted in
// between: a restart or another instance does not alert twice about the same
// dead letters.
type Probe struct {
	cfg                           ProbeConfig
	pool                          *pgxpool.Pool
	stmt, watermark, setWatermark string
	lockKey                       int64

	dbAlerted bool // the database outage was alerted
	// lastTotal is the count this process saw at its last probe, when the
	// watermark was lastMark (-1: none since it last held the probe's lock).
	// A dead letter is stamped when its page moves it and counted once that
	// page commits, seconds later: a probe in between moved the watermark
	// past its stamp, and it never counted as new (an independent review,
	// 2026-11-29). A count above the last one is growth, whatever the
	// stamps say, but only while the watermark is the one this process saw:
	// a watermark moved since says another instance probed (and alerted),
	// and its count is then this process's to take, not to alert again.
	lastTotal int
	lastMark  time.Time
}

// NewProbe returns a probe for cfg.Table.
func NewProbe(pool *pgxpool.Pool, cfg ProbeConfig) (*Probe, error) {
	cfg.Table = cfg.Table.WithDefaults()
	if err := cfg.Table.Validate(); err != nil {
		return nil, err
	}
	if cfg.Alerter == nil {
		return nil, fmt.Errorf("dead-letter probe: no alerter")
	}
	if cfg.Threshold <= 0 {
		cfg.Threshold = DeadLetterThresholdDefault
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	t := cfg.Table
	return &Probe{cfg: cfg, pool: pool, stmt: statement(t, "dead_letter_probe"),
		watermark: statement(t, "probe_watermark"), setWatermark: statement(t, "probe_watermark_set"),
		lockKey: writer.AdvisoryKey("outbox-sweeper probe " + t.String()), lastTotal: -1}, nil
}

// ProbeResult says what one run saw and did.
type ProbeResult struct {
	Count   int // dead letters in all
	New     int // dead-lettered since the last alert that went out
	Alerted bool
	Skipped bool // another instance runs the probe
}

// RunOnce looks at the dead-letter table once, and alerts if it must.
func (p *Probe) RunOnce(ctx context.Context) (ProbeResult, error) {
	var res ProbeResult
	now := time.Now()
	var postErr error
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		// One instance probes: the others would repeat its alerts.
		var locked bool
		if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", p.lockKey).Scan(&locked); err != nil {
			return err
		}
		if !locked {
			res.Skipped = true
			p.lastTotal = -1 // another instance alerts meanwhile
			return nil
		}
		var since time.Time
		if err := tx.QueryRow(ctx, p.watermark).Scan(&since); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, p.stmt, since, maxAlertCorrelationIDs)
		if err != nil {
			return err
		}
		var (
			id            *int64
			correlationID *string
			reason        *string
			at            *time.Time
			a             = alert.Alert{Time: now.UTC(), Severity: alert.Critical, Component: "dead-letter-probe", Table: p.cfg.Table.DeadLetterName()}
			latest        = since
		)
		_, err = pgx.ForEachRow(rows, []any{&res.Count, &res.New, &id, &correlationID, &reason, &at}, func() error {
			if id == nil {
				return nil
			}
			if correlationID != nil {
				a.CorrelationIDs = append(a.CorrelationIDs, *correlationID)
			}
			if !slices.Contains(a.Reasons, *reason) {
				a.Reasons = append(a.Reasons, *reason)
			}
			if at.After(latest) {
				latest = *at
			}
			return nil
		})
		if err != nil {
			return err
		}
		if grown := res.Count - p.lastTotal; p.lastTotal >= 0 && since.Equal(p.lastMark) && grown > res.New {
			res.New = grown // committed after the last probe, stamped before it
		}
		if res.Count < p.cfg.Threshold || res.New == 0 {
			p.lastTotal, p.lastMark = res.Count, since
			return nil
		}
		a.Count = res.Count
		a.Summary = fmt.Sprintf("%d dead letters in %s.%s (%d new)", res.Count, p.cfg.Table.Schema, p.cfg.Table.DeadLetterName(), res.New)
		a.Action = "find out why with `sweeper dlq list --schema " + p.cfg.Table.Schema + " --table " + p.cfg.Table.Name +
			"`, fix the cause, then `sweeper dlq replay` the rows (or purge them)"
		// Posted while the lock is held, so no other instance alerts the same
		// rows meanwhile; the watermark moves only if the post went out.
		if postErr = p.cfg.Alerter.Alert(ctx, a); postErr != nil {
			return nil
		}
		// An alert always moves the watermark, so that another instance
		// knows it went out (and does not alert the same growth again),
		// even one of rows stamped before it.
		if !latest.After(since) {
			latest = since.Add(time.Microsecond)
		}
		if _, err := tx.Exec(ctx, p.setWatermark, latest); err != nil {
			return err
		}
		p.lastTotal, p.lastMark = res.Count, latest
		res.Alerted = true
		return nil
	})
	if err != nil {
		res.Alerted = false
		if !p.dbAlerted {
			aerr := p.cfg.Alerter.Alert(ctx, alert.Alert{Time: now.UTC(), Severity: alert.Critical, Component: "dead-letter-probe",
				Summary: fmt.Sprintf("the dead-letter probe cannot read %s: %v", p.cfg.Table, err),
				Table:   p.cfg.Table.DeadLetterName(), Action: "check that the database is up and the sweeper can reach it"})
			p.dbAlerted = aerr == nil
		}
		return res, fmt.Errorf("dead-letter probe of %s: %w", p.cfg.Table, err)
	}
	p.dbAlerted = false
	if postErr != nil {
		p.cfg.Logger.Warn("dead-letter alert not delivered; the next probe tries again", "err", postErr, "count", res.Count)
	}
	return res, nil
}

// RunOnSchedule calls run at every time sched gives until ctx is done, logging
// errors; the maintenance services run this way beside the sweeper.
func RunOnSchedule(ctx context.Context, sched Schedule, logger *slog.Logger, name string, run func(context.Context) error) {
	for {
		next := sched.Next(time.Now())
		if !sleepUntil(ctx, next) {
			return
		}
		if err := run(ctx); err != nil && ctx.Err() == nil {
			logger.Error(name+" failed; it runs again at its next time", "err", err)
		}
	}
}
