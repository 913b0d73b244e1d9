package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/test/tcpproxy"
)

// FleetBacklogs counts each outbox's outstanding rows and reads its oldest
// row's age; an outbox whose schema was dropped since the fleet listed them
// is left out, and the others are still read (the statement that names the
// dropped table fails as a whole: they are asked again one by one).
func TestFleetBacklogsLeaveOutADroppedTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	two, none, gone := dbtest.Table(t), dbtest.Table(t), dbtest.Table(t)
	w, err := outbox.NewWriter(two)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, pool, outbox.Message{Topic: "a", Payload: []byte("1")}, outbox.Message{Topic: "b", Payload: []byte("2")}))
	_, err = pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{gone.Schema}.Sanitize()+" CASCADE")
	require.NoError(t, err)

	var outboxes []admin.FleetOutbox
	for _, tbl := range []outbox.Table{two, gone, none} {
		outboxes = append(outboxes, admin.FleetOutbox{Config: admin.Config{Pool: pool, Table: tbl}})
	}
	got, err := admin.FleetBacklogs(ctx, "outbox", outboxes)
	require.NoError(t, err)
	require.Len(t, got, 2, "the dropped tenant left out, the others read: %v", got)
	require.EqualValues(t, 2, got[two.Schema].Rows)
	require.NotNil(t, got[two.Schema].OldestAgeSeconds)
	require.Zero(t, got[none.Schema].Rows)
	require.Nil(t, got[none.Schema].OldestAgeSeconds)
	_, ok := got[gone.Schema]
	require.False(t, ok)
}

// A database that does not answer (accepted, then silent, as a server
// half-dead would be) is left out with an error naming it, and the others'
// backlogs are read beside it within the caller's deadline: the databases
// are asked at once. (Asked in turn, in the map's random order, the live
// one comes after a hung one in three runs of four on average, and is lost
// with them: 2 of 4 runs failed so.)
func TestFleetBacklogsReadEveryDatabaseBesideAHungOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	live := dbtest.Table(t)
	w, err := outbox.NewWriter(live)
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, pool, outbox.Message{Topic: "a", Payload: []byte("1")}))
	outboxes := []admin.FleetOutbox{{Config: admin.Config{Pool: pool, Table: live}}}
	for i := range 3 {
		proxy := tcpproxy.New(t, brokertest.HostPort(t, dbtest.URL(t)))
		proxy.Hang(true)
		hung, err := pgxpool.New(ctx, brokertest.WithHost(t, dbtest.URL(t), proxy.Addr()))
		require.NoError(t, err)
		t.Cleanup(hung.Close)
		outboxes = append(outboxes, admin.FleetOutbox{Name: fmt.Sprintf("hung%d.%s", i, live.Schema),
			Config: admin.Config{Pool: hung, Table: live}})
	}
	// A scrape's deadline (metrics.backlogTimeout): what a hung database
	// takes. The live database's statement takes milliseconds of it.
	deadline, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err := admin.FleetBacklogs(deadline, "outbox", outboxes)
	require.Error(t, err, "the hung databases")
	require.EqualValues(t, 1, got[live.Schema].Rows, "the live database's backlog read beside them: %v", got)
	require.Len(t, got, 1)
}

// Past FleetBacklogCounted rows a backlog is not counted on: it reads
// Postgres's estimate, in FleetBacklogs (the per-tenant series) and in GET
// /outboxes alike.
func TestFleetBacklogsPastTheCountTakeTheEstimate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	deep := dbtest.Table(t)
	rows := admin.FleetBacklogCounted + 5
	// One session: the insert's row counts reach the statistics when its
	// session flushes them (at most once a second), and a flush after the
	// ANALYZE added them to its estimate again (20,010 read once in CI). The
	// flush is forced before the ANALYZE.
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO "+deep.Ident()+" (topic, payload) SELECT 'a', '\\x00'::bytea FROM generate_series(1, $1::int)", rows)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT pg_catalog.pg_stat_force_next_flush()")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ANALYZE "+deep.Ident())
	require.NoError(t, err)
	conn.Release()
	outboxes := []admin.FleetOutbox{{Config: admin.Config{Pool: pool, Table: deep, Logger: slog.New(slog.DiscardHandler)}}}

	got, err := admin.FleetBacklogs(ctx, "outbox", outboxes)
	require.NoError(t, err)
	require.EqualValues(t, rows, got[deep.Schema].Rows, "the estimate after ANALYZE")
	require.NotNil(t, got[deep.Schema].OldestAgeSeconds)

	srv := httptest.NewServer(admin.FleetHandler(admin.FleetConfig{Base: outboxes[0].Config, TableName: "outbox",
		Outboxes: func() []admin.FleetOutbox { return outboxes }}))
	defer srv.Close()
	code, raw := fleetCall(t, srv, "/outboxes", "")
	require.Equal(t, http.StatusOK, code, "%s", raw)
	var body struct {
		Outboxes []struct {
			Backlog int64 `json:"backlog"`
		} `json:"outboxes"`
	}
	require.NoError(t, json.Unmarshal(raw, &body))
	require.Len(t, body.Outboxes, 1)
	require.EqualValues(t, rows, body.Outboxes[0].Backlog)
}

// A database whose row estimates cannot be read (here, the relay's role may
// not call pg_stat_get_live_tuples, as a locked-down role may not) leaves its
// deep backlog at the capped count, FleetBacklogCounted+1, and says so in the
// error, naming the database as the relay names it; the other databases' backlogs are read beside
// it.
func TestFleetBacklogsKeepTheCountWhenTheEstimateFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The role is made before the database, so that its cleanup (DROP
	// ROLE) runs after the database's, which holds its grants. It cannot
	// log in: the reader's sessions take it with SET ROLE, so no password
	// is needed where the server asks for one.
	role := pgx.Identifier{dbtest.Schema(t) + "_reader"}.Sanitize()
	_, err := dbtest.Pool(t).Exec(ctx, "CREATE ROLE "+role+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		if _, err := dbtest.Pool(t).Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	dbURL := dbtest.Database(t)
	owner, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer owner.Close()
	deep := outbox.Table{Schema: "tenant_deep", Name: "outbox"}
	conn, err := owner.Acquire(ctx)
	require.NoError(t, err)
	_, err = outbox.Migrate(ctx, conn.Conn(), deep)
	require.NoError(t, err)
	conn.Release()
	for _, q := range []string{
		"INSERT INTO " + deep.Ident() + " (topic, payload) SELECT 'a', '\\x00'::bytea FROM generate_series(1, " + fmt.Sprint(admin.FleetBacklogCounted+5) + ")",
		"GRANT USAGE ON SCHEMA tenant_deep TO " + role,
		"GRANT SELECT ON ALL TABLES IN SCHEMA tenant_deep TO " + role,
		// Function privileges belong to the database: the shared test
		// database's are untouched.
		"REVOKE EXECUTE ON FUNCTION pg_catalog.pg_stat_get_live_tuples(oid) FROM PUBLIC",
	} {
		_, err := owner.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET ROLE "+role)
		return err
	}
	reader, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer reader.Close()

	other := dbtest.Table(t)
	_, err = dbtest.Pool(t).Exec(ctx, "INSERT INTO "+other.Ident()+" (topic, payload) VALUES ('a', 'x'), ('a', 'y')")
	require.NoError(t, err)
	logger := slog.New(slog.DiscardHandler)
	got, err := admin.FleetBacklogs(ctx, "outbox", []admin.FleetOutbox{
		// Named as a list names it (fleet.ListedName), not as its URL does.
		{Config: admin.Config{Pool: reader, Table: deep, Logger: logger, Database: "eu1"}},
		{Config: admin.Config{Pool: dbtest.Pool(t), Table: other, Logger: logger}},
	})
	require.Error(t, err, "an estimate that could not be read")
	require.ErrorContains(t, err, "row estimates")
	require.ErrorContains(t, err, "permission denied")
	require.ErrorContains(t, err, `database "eu1": read the outboxes' row estimates`, "the database whose estimates failed is named")
	require.EqualValues(t, admin.FleetBacklogCounted+1, got[deep.Schema].Rows, "the capped count stands")
	require.NotNil(t, got[deep.Schema].OldestAgeSeconds)
	require.EqualValues(t, 2, got[other.Schema].Rows, "the other database's backlog")
}
