package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ceilingRate is the minimal table's claim-and-mark rate, in rows a second:
// the table of issue 32 (an identity key, topic, payload, dispatched_at, and
// one partial index on the outstanding ids), rows rows of size bytes over
// topics, claimed by one connection in 1,000-row statements until none is
// left. With keyset, each statement starts after the last id the previous one
// returned (as test/bench/ceiling does and the sweeper's page query does);
// without, each starts from the table's head, as the issue writes it, and steps
// over the index entries of the rows marked before it that no vacuum has
// removed yet.
func ceilingRate(ctx context.Context, url string, rows, size, topics int, keyset bool) (float64, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	for _, q := range []string{
		`DROP TABLE IF EXISTS soak_ceiling`,
		`CREATE TABLE soak_ceiling (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, topic text NOT NULL,
			payload bytea NOT NULL, dispatched_at timestamptz)`,
		`CREATE INDEX soak_ceiling_outstanding ON soak_ceiling (id) WHERE dispatched_at IS NULL`,
		fmt.Sprintf(`INSERT INTO soak_ceiling (topic, payload)
			SELECT 'soak.topic-' || (g %% %d), convert_to(repeat('x', %d), 'UTF8') FROM generate_series(0, %d) g`,
			topics, size, rows-1),
		`VACUUM ANALYZE soak_ceiling`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return 0, fmt.Errorf("ceiling setup: %s: %w", q, err)
		}
	}
	claim := `WITH c AS (SELECT id FROM soak_ceiling WHERE dispatched_at IS NULL ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)
		UPDATE soak_ceiling t SET dispatched_at = now() FROM c WHERE t.id = c.id RETURNING t.id, t.topic, t.payload`
	if keyset {
		claim = `WITH c AS (SELECT id FROM soak_ceiling WHERE dispatched_at IS NULL AND id > $1 ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED)
			UPDATE soak_ceiling t SET dispatched_at = now() FROM c WHERE t.id = c.id RETURNING t.id, t.topic, t.payload`
	}
	var (
		id, last int64
		topic    string
		payload  []byte
		total    int
	)
	start := time.Now()
	for {
		var r pgx.Rows
		if keyset {
			r, err = conn.Query(ctx, claim, last)
		} else {
			r, err = conn.Query(ctx, claim)
		}
		if err != nil {
			return 0, err
		}
		n := 0
		if _, err := pgx.ForEachRow(r, []any{&id, &topic, &payload}, func() error {
			n++
			last = max(last, id)
			return nil
		}); err != nil {
			return 0, err
		}
		if n == 0 {
			break
		}
		total += n
	}
	elapsed := time.Since(start)
	if total != rows {
		return 0, fmt.Errorf("the ceiling claimed %d rows of %d", total, rows)
	}
	return float64(total) / elapsed.Seconds(), nil
}

// loadBacklog writes n rows through the insert statement, 1,000 a statement,
// then vacuums and analyses the database, as a steady-state outbox would be.
func loadBacklog(ctx context.Context, url, insert string, n, size int, topics []string) error {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	const chunk = 1000
	ts := make([]string, 0, chunk)
	ps := make([][]byte, 0, chunk)
	payload := make([]byte, size)
	for i := range payload {
		payload[i] = 'x'
	}
	for i := 0; i < n; i += chunk {
		ts, ps = ts[:0], ps[:0]
		for j := i; j < min(n, i+chunk); j++ {
			ts = append(ts, topics[j%len(topics)])
			ps = append(ps, payload)
		}
		if _, err := pool.Exec(ctx, insert, ts, ps); err != nil {
			return fmt.Errorf("load the backlog: %w", err)
		}
	}
	_, err = pool.Exec(ctx, "VACUUM ANALYZE")
	return err
}

// drainRate loads a backlog of n rows into a fresh database, runs the binary
// with args on it and returns n over the time from its start to the n-th line
// on its standard output, and the time from its start to the first line.
func drainRate(ctx context.Context, cfg *config, cl *cluster, db string, n int, args []string) (float64, time.Duration, error) {
	url, err := cl.createDB(ctx, db)
	if err != nil {
		return 0, 0, err
	}
	if err := migrate(ctx, cfg, url); err != nil {
		return 0, 0, err
	}
	if err := loadBacklog(ctx, url, cfg.insert, n, cfg.size, cfg.topicNames()); err != nil {
		return 0, 0, err
	}
	first, reached := make(chan time.Time, 1), make(chan time.Time, 1)
	start := time.Now()
	s, err := startSweeper(cfg.bin, url, args, func(out io.Reader) error {
		return countLines(out, int64(n), first, reached)
	})
	if err != nil {
		return 0, 0, err
	}
	var end time.Time
	select {
	case end = <-reached:
	case <-ctx.Done():
		_ = s.stop()
		return 0, 0, ctx.Err()
	case <-time.After(cfg.drainLimit):
		_ = s.stop()
		return 0, 0, fmt.Errorf("the binary did not send %d messages within %s", n, cfg.drainLimit)
	}
	if err := s.stop(); err != nil {
		fmt.Fprintf(os.Stderr, "soak: sweeper exit after the drain: %v\n", err)
	}
	// Its rows would otherwise be vacuumed while the soak runs.
	if err := cl.dropDB(ctx, db); err != nil {
		return 0, 0, err
	}
	return float64(n) / end.Sub(start).Seconds(), (<-first).Sub(start), nil
}
