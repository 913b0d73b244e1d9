package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// History partitions. The history table (migration 10) holds the dispatched
// rows, partitioned by range of dispatched_at; retention retires them by
// dropping whole partitions, which leaves no dead row behind, however long
// something holds the vacuum horizon (DESIGN.md, "It lives for months").
//
// Each partition is historyWidth(retention) wide, and named by its start, in
// UTC: <table>_h_YYYYMMDD_hhmmss. Retention creates the current partition and
// the next ones (historyAhead, or as many as cover RetentionConfig.Ahead) at
// the sweeper's start and at each run, and drops
// those whose upper bound is older than the retention. The count stays
// bounded: at most retention/width+1 (7 or 8 while the width is retention/7;
// retention in days, plus one, for a retention above a week) behind now, the
// ahead ones (Ahead/width, at least historyAhead), and DEFAULT. A retention that keeps rows forever drops none.
//
// The DEFAULT partition catches moves no partition covers (retention did not
// run for longer than the partitions ahead last, the clock jumped): a page
// never fails for want of one. Retention empties it by row DELETE.
//
// Locks: attaching a partition takes SHARE UPDATE EXCLUSIVE on the history
// table, which the moves' inserts (ROW EXCLUSIVE) do not conflict with, and
// ACCESS EXCLUSIVE on the DEFAULT partition, which it scans for rows of the
// new range: moves that land in DEFAULT wait for that scan, a moment while
// DEFAULT is empty as it normally is; dropping one takes ACCESS EXCLUSIVE on
// the history table, for the moment of the drop. Either waits at most
// partitionLockTimeout for the moves running then, then gives up until the
// next run. Neither ever locks the outbox.

// historyAhead is how many partitions past the current one retention keeps
// ready.
const historyAhead = 2

// partitionStorage is the storage of the partitions the sweeper creates:
// autovacuum off, for the table and its TOAST table. A partition only takes
// the moves' inserts, the relay never reads it, and retention drops it
// whole, so vacuum has no dead row to remove and the relay no use for its
// statistics; an insert-only table is still vacuumed at every fifth of its
// rows (Postgres 13's autovacuum_vacuum_insert_scale_factor, to set its pages
// all-visible), which while a drain runs is seconds of reads and writes a
// visit beside the application's commits (ADR 0001, "History partitions
// without autovacuum"). Postgres still vacuums a partition whose
// relfrozenxid, set when it is created, is older than
// autovacuum_freeze_max_age, whatever this says. The DEFAULT partition, which
// retention deletes from, keeps autovacuum.
const partitionStorage = "WITH (autovacuum_enabled = false, toast.autovacuum_enabled = false)"

// defaultMargin is how far past the database's clock a partition starts
// while the moves land in DEFAULT (planPartitions): longer than any move
// waits behind the ATTACH's scan of DEFAULT.
const defaultMargin = time.Minute

// partitionLockTimeout bounds how long creating or dropping a partition waits
// for its lock (and so how long moves queue behind it).
const partitionLockTimeout = "500ms"

// historyWidth returns the width of the history partitions for a retention:
// a seventh of it, in whole seconds, at least a second and at most a day (a
// retention that keeps rows forever gets a day).
func historyWidth(retention time.Duration) time.Duration {
	if retention <= 0 {
		return 24 * time.Hour
	}
	return min(max((retention/7).Truncate(time.Second), time.Second), 24*time.Hour)
}

// historyPartition is a partition of the history table.
type historyPartition struct {
	name         string
	isDefault    bool
	lower, upper *time.Time
}

// partitionName names the partition of t's history starting at start.
func partitionName(t Table, start time.Time) string {
	return t.Name + "_h_" + start.UTC().Format("20060102_150405")
}

// listPartitions reads the history table's partitions, and the database's
// clock.
func (r *Retention) listPartitions(ctx context.Context, conn *pgx.Conn) ([]historyPartition, time.Time, error) {
	var now time.Time
	var parts []historyPartition
	// The bounds are parsed from the catalog's text, which the session's
	// DateStyle prints: under SQL or Postgres a zone's abbreviation, which
	// reads back as another zone's (Shanghai's CST as US Central's, 14 h
	// off). ISO in UTC prints an offset, which reads back as written.
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, set := range []string{"SET LOCAL DateStyle = 'ISO'", "SET LOCAL TimeZone = 'UTC'"} {
			if _, err := tx.Exec(ctx, set); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, r.historyPartitions, HistoryIdent(r.cfg.Table))
		if err != nil {
			return err
		}
		var p historyPartition
		parts, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (historyPartition, error) {
			err := row.Scan(&p.name, &p.isDefault, &p.lower, &p.upper, &now)
			return p, err
		})
		return err
	})
	return parts, now, err
}

// planPartitions returns the ranges to create so that [now, now + (ahead+1) ×
// width) is covered, given the partitions there are and the newest row of the
// DEFAULT partition (nil: none). Ranges are aligned on multiples of width
// (counted from time.Time's zero, so a day's width starts at midnight UTC)
// and cut where a partition already begins, so a width
// that changed (a new --retention) never overlaps the partitions made before.
func planPartitions(parts []historyPartition, defaultNewest *time.Time, now time.Time, width time.Duration, ahead int) [][2]time.Time {
	pos := now.Truncate(width)
	end := pos.Add(time.Duration(ahead+1) * width)
	if defaultNewest != nil && (!defaultNewest.Before(pos) || defaultNewest.After(now.Add(-defaultMargin))) {
		// A partition may not take rows the DEFAULT partition holds, nor,
		// while moves land there (its newest row is recent), start where
		// they are stamped: the ATTACH locks DEFAULT and scans it, and a
		// move stamped past the new lower bound that waited behind it fails
		// its insert (the partition constraint), rolling back a page whose
		// rows the broker took: each sent again. defaultMargin later, the
		// moves still landing in DEFAULT are stamped below it.
		pos = defaultNewest.Truncate(time.Second).Add(time.Second)
		if margin := now.Add(defaultMargin).Truncate(time.Second); margin.After(pos) {
			pos = margin
		}
		if e := pos.Truncate(width).Add(time.Duration(ahead+1) * width); e.After(end) {
			end = e
		}
	}
	var out [][2]time.Time
	for pos.Before(end) {
		next := pos.Truncate(width).Add(width)
		covered := false
		for _, p := range parts {
			if p.lower == nil || p.upper == nil {
				continue
			}
			if !pos.Before(*p.lower) && pos.Before(*p.upper) {
				pos, covered = *p.upper, true
				break
			}
			if p.lower.After(pos) && p.lower.Before(next) {
				next = *p.lower
			}
		}
		if covered {
			continue
		}
		out = append(out, [2]time.Time{pos, next})
		pos = next
	}
	return out
}

// ensurePartitions creates the current history partition and the next
// that cover RetentionConfig.Ahead (at least historyAhead), where missing. A partition whose lock could not be had in
// partitionLockTimeout is left for the next run. It returns how many it
// created.
func (r *Retention) ensurePartitions(ctx context.Context, conn *pgx.Conn) (int, error) {
	parts, now, err := r.listPartitions(ctx, conn)
	if err != nil {
		return 0, r.explainHistory(err)
	}
	var newest *time.Time
	if err := conn.QueryRow(ctx, r.historyDefaultSpan).Scan(&newest); err != nil {
		return 0, r.explainHistory(err)
	}
	created := 0
	var errs []error
	ahead := max(historyAhead, int((r.cfg.Ahead+r.width-1)/r.width))
	for _, rg := range planPartitions(parts, newest, now, r.width, ahead) {
		name := pgx.Identifier{r.cfg.Table.Schema, partitionName(r.cfg.Table, rg[0])}.Sanitize()
		// Created apart and then attached, rather than with CREATE TABLE …
		// PARTITION OF, which locks the history table against the moves.
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for _, stmt := range []string{
				"SET LOCAL lock_timeout = '" + partitionLockTimeout + "'",
				"CREATE TABLE " + name + " (LIKE " + HistoryIdent(r.cfg.Table) + " INCLUDING DEFAULTS INCLUDING CONSTRAINTS) " + partitionStorage,
				"ALTER TABLE " + HistoryIdent(r.cfg.Table) + " ATTACH PARTITION " + name +
					" FOR VALUES FROM ('" + rg[0].UTC().Format(time.RFC3339Nano) + "') TO ('" + rg[1].UTC().Format(time.RFC3339Nano) + "')",
			} {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return err
				}
			}
			return nil
		})
		if lockTimedOut(err) {
			r.cfg.Logger.Warn("a history partition waited too long for its lock; the next retention run creates it",
				"table", r.cfg.Table.String(), "partition", name)
			continue
		}
		if err != nil {
			// The next range may yet be made: a hand-made partition in
			// this one's way is no reason to leave the moves of later
			// hours to DEFAULT.
			errs = append(errs, fmt.Errorf("create history partition %s: %w", name, err))
			continue
		}
		created++
	}
	return created, errors.Join(errs...)
}

// dropPartitions drops the history partitions whose every row is older than
// the retention (their upper bound is), and empties the DEFAULT partition of
// such rows. It returns how many partitions it dropped and how many rows it
// deleted from DEFAULT.
func (r *Retention) dropPartitions(ctx context.Context, conn *pgx.Conn) (dropped, deleted int, err error) {
	parts, now, err := r.listPartitions(ctx, conn)
	if err != nil {
		return 0, 0, r.explainHistory(err)
	}
	horizon := now.Add(-r.cfg.Dispatched)
	var errs []error
	for _, p := range parts {
		if p.isDefault || p.upper == nil || p.upper.After(horizon) {
			continue
		}
		name := pgx.Identifier{r.cfg.Table.Schema, p.name}.Sanitize()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+partitionLockTimeout+"'"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP TABLE "+name)
			return err
		})
		if lockTimedOut(err) {
			r.cfg.Logger.Warn("a history partition past retention waited too long for its lock; the next retention run drops it",
				"table", r.cfg.Table.String(), "partition", name)
			continue
		}
		if err != nil {
			// Another partition, and DEFAULT, may yet be emptied.
			errs = append(errs, fmt.Errorf("drop history partition %s: %w", name, err))
			continue
		}
		dropped++
	}
	deleted, err = r.deleteAll(ctx, conn, r.deleteHistoryDefault, r.cfg.Dispatched)
	if err != nil {
		errs = append(errs, fmt.Errorf("delete from the DEFAULT history partition: %w", err))
	}
	return dropped, deleted, errors.Join(errs...)
}

// explainHistory says what to do when the history table is missing.
func (r *Retention) explainHistory(err error) error {
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (pgErr.Code == "42P01" || pgErr.Code == "42704") {
		return fmt.Errorf("%w: %s does not exist (schema version 10 makes it): run `sweeper migrate --schema %s --table %s` against this database: %w",
			ErrNoHistory, HistoryIdent(r.cfg.Table), r.cfg.Table.Schema, r.cfg.Table.Name, err)
	}
	return err
}

// ErrNoHistory says the outbox's history table does not exist: its schema
// predates migration 10, or the table was dropped by hand, and the sweeper
// cannot move sent rows.
var ErrNoHistory = errors.New("the outbox has no history table")

func lockTimedOut(err error) bool {
	pgErr, ok := errors.AsType[*pgconn.PgError](err)
	return ok && pgErr.Code == "55P03" // lock_not_available
}
