package fleet_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/fleet"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// databases creates n databases, each with two tenant schemas (a, b)
// migrated, drops them at cleanup, and returns their URLs.
func databases(t *testing.T, n int) []string {
	t.Helper()
	var urls []string
	for range n {
		u := dbtest.Database(t)
		for _, s := range []string{"a", "b"} {
			require.NoError(t, migrate(u, outbox.Table{Schema: s, Name: "outbox"}))
		}
		urls = append(urls, u)
	}
	return urls
}

// anotherURL returns u with application_name set to app: the same
// database under another URL, as a password rotated or another server
// holding a database of that name would list it.
func anotherURL(t *testing.T, u, app string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	q := parsed.Query()
	q.Set("application_name", app)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// dbName is the database's name in its URL, the name Databases gives it.
func dbName(u string) string { p, _ := url.Parse(u); return strings.TrimPrefix(p.Path, "/") }

func writeTo(t *testing.T, dbURL, schema string, msgs ...outbox.Message) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	w, err := outbox.NewWriter(outbox.Table{Schema: schema, Name: "outbox"})
	require.NoError(t, err)
	require.NoError(t, w.Write(context.Background(), conn, msgs...))
}

// Five databases of two tenants each (schemas a and b in every one), four
// listed at start: rows of every tenant of every listed database arrive
// once, under their database's and tenant's name ({database}.{schema}); a
// database added to the list is relayed on Reload, one taken off is let go,
// and the admin API names each outbox by database and schema.
func TestDatabasesRelayEveryListedDatabase(t *testing.T) {
	urls := databases(t, 5)
	var mu sync.Mutex
	listed := slices.Clone(urls[:4])
	p := memory.New(memory.Config{})
	l := &logs{}
	logger := slogText(l)
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	d, err := fleet.NewDatabases(p, fleet.DatabasesOptions{
		Fleet: fleet.Options{Destination: "{database}.{schema}.{topic}", Logger: logger, Probe: outbox.ProbeConfig{Alerter: alert.Log{Logger: logger}},
			Discover: 200 * time.Millisecond, Admin: admin.Config{Addr: addr}},
		URLs: func() ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(listed), nil
		},
		Recheck: time.Hour, // only Reload reads the list again
	})
	require.NoError(t, err)
	start(t, d)
	relaying := func(u string, tenants int) func() bool {
		return func() bool {
			f, ok := d.Fleet(dbName(u))
			return ok && len(f.Outboxes()) == tenants
		}
	}
	for _, u := range urls[:4] {
		dbtest.Eventually(t, time.Minute, "database "+dbName(u)+" relayed", relaying(u, 2))
	}
	delivered := func(payload string) func() bool {
		return func() bool {
			return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == payload })
		}
	}
	for _, u := range urls[:4] {
		for _, s := range []string{"a", "b"} {
			writeTo(t, u, s, outbox.Message{Topic: "orders", Payload: []byte(dbName(u) + "/" + s)})
		}
	}
	for _, u := range urls[:4] {
		for _, s := range []string{"a", "b"} {
			dbtest.Eventually(t, time.Minute, "the row of "+dbName(u)+"."+s, delivered(dbName(u)+"/"+s))
		}
	}
	// Each database holds schemas a and b: {database} keeps db1's tenant a
	// apart from db2's.
	for _, m := range p.Messages() {
		db, schema, _ := strings.Cut(string(m.Payload), "/")
		require.Equal(t, db+"."+schema+".orders", m.Topic, "row %q sent under another tenant's name", m.Payload)
	}
	require.Len(t, p.Messages(), 8, "every row once")

	// The fifth database joins, the first leaves.
	mu.Lock()
	listed = slices.Clone(urls[1:5])
	mu.Unlock()
	d.Reload()
	dbtest.Eventually(t, time.Minute, "the fifth database relayed", relaying(urls[4], 2))
	dbtest.Eventually(t, time.Minute, "the first database let go", func() bool { return !slices.Contains(d.Names(), dbName(urls[0])) })
	writeTo(t, urls[4], "b", outbox.Message{Topic: "orders", Payload: []byte(dbName(urls[4]) + "/b")})
	dbtest.Eventually(t, time.Minute, "the fifth database's row", delivered(dbName(urls[4])+"/b"))
	// Let go means no session left on it: a row written there now has no
	// connection that could claim it.
	dbtest.Eventually(t, time.Minute, "no session left on the first database", func() bool {
		var n int
		require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(),
			"SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE datname = $1", dbName(urls[0])).Scan(&n))
		return n == 0
	})
	writeTo(t, urls[0], "a", outbox.Message{Topic: "orders", Payload: []byte("after leaving")})
	// Names sorts by name, which is not the list's order once a name's
	// number reaches 10.
	require.ElementsMatch(t, []string{dbName(urls[1]), dbName(urls[2]), dbName(urls[3]), dbName(urls[4])}, d.Names())

	code, body := adminGet(t, addr, "/outboxes")
	require.Equal(t, 200, code, "%v", body)
	require.EqualValues(t, 8, body["total"])
	first := body["outboxes"].([]any)[0].(map[string]any)
	require.Equal(t, first["database"].(string)+"."+first["schema"].(string), first["name"])
	code, body = adminGet(t, addr, "/outboxes/"+first["name"].(string)+"/status")
	require.Equal(t, 200, code, "%v", body)
	require.False(t, slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "after leaving" }),
		"a database off the list is not relayed")
}

// An edited list takes effect without a signal: it is read again every
// Recheck, a database added is relayed and one taken off is let go.
func TestDatabasesReadTheirListAgainUnasked(t *testing.T) {
	urls := databases(t, 2)
	var mu sync.Mutex
	listed := urls[:1]
	p := memory.New(memory.Config{})
	logger := slogText(&logs{})
	d, err := fleet.NewDatabases(p, fleet.DatabasesOptions{
		Fleet: fleet.Options{Logger: logger, Probe: outbox.ProbeConfig{Alerter: alert.Log{Logger: logger}}, Discover: 200 * time.Millisecond},
		URLs: func() ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(listed), nil
		},
		Recheck: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	start(t, d)
	dbtest.Eventually(t, time.Minute, "the first database relayed", func() bool { return slices.Equal(d.Names(), []string{dbName(urls[0])}) })
	mu.Lock()
	listed = urls[1:]
	mu.Unlock()
	dbtest.Eventually(t, time.Minute, "the list read again: the second database in, the first out", func() bool {
		return slices.Equal(d.Names(), []string{dbName(urls[1])})
	})
	writeTo(t, urls[1], "a", outbox.Message{Topic: "orders", Payload: []byte("added unasked")})
	dbtest.Eventually(t, time.Minute, "the added database's row", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "added unasked" })
	})
}

// Databases taken off the list are let go at once: one whose send hangs
// (its broker slow) does not keep the others' fleets running and their
// connections open until it ends. Nothing is lost meanwhile: the held row
// is sent once the send returns. (Halted one after another, in the map's
// random order, the others wait for the stuck one in three runs of four.)
func TestDatabasesLetGoOfSeveralAtOnce(t *testing.T) {
	urls := databases(t, 4)
	stuck := dbName(urls[0])
	release := make(chan struct{})
	sending := make(chan struct{}, 1)
	p := memory.New(memory.Config{})
	p.SetSendFunc(func(_ context.Context, b producer.Batch) error {
		if strings.HasPrefix(b.Topic, stuck+".") {
			select {
			case sending <- struct{}{}:
			default:
			}
			<-release // deaf to its context: a send that outlasts a stop
		}
		return nil
	})
	var released sync.Once
	defer released.Do(func() { close(release) })
	var mu sync.Mutex
	listed := slices.Clone(urls)
	d, _ := startDatabases(t, p, func() ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(listed), nil
	}, fleet.Options{Destination: "{database}.{topic}"})
	for _, u := range urls {
		dbtest.Eventually(t, time.Minute, "database "+dbName(u)+" relayed", func() bool {
			f, ok := d.Fleet(dbName(u))
			return ok && len(f.Outboxes()) == 2
		})
	}
	writeTo(t, urls[0], "a", outbox.Message{Topic: "orders", Payload: []byte("held")})
	<-sending

	mu.Lock()
	listed = nil
	mu.Unlock()
	d.Reload()
	sessions := func(u string) int {
		var n int
		require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(),
			"SELECT count(*) FROM pg_stat_activity WHERE datname = $1", dbName(u)).Scan(&n))
		return n
	}
	for _, u := range urls[1:] {
		dbtest.Eventually(t, time.Minute, "database "+dbName(u)+" let go, its connections closed", func() bool { return sessions(u) == 0 })
	}
	require.Positive(t, sessions(urls[0]), "the stuck database's fleet waits for its send")
	released.Do(func() { close(release) })
	dbtest.Eventually(t, time.Minute, "the stuck database let go", func() bool { return sessions(urls[0]) == 0 })
	require.True(t, slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "held" }),
		"the held row sent")
	require.Empty(t, d.Names())
}

// startDatabases relays the databases urls lists, read again only on
// Reload, into p; the logs are returned.
func startDatabases(t *testing.T, p producer.Producer, urls func() ([]string, error), opts fleet.Options) (*fleet.Databases, *logs) {
	t.Helper()
	l := &logs{}
	logger := slogText(l)
	opts.Logger, opts.Probe, opts.Discover = logger, outbox.ProbeConfig{Alerter: alert.Log{Logger: logger}}, 200*time.Millisecond
	d, err := fleet.NewDatabases(p, fleet.DatabasesOptions{
		Fleet:   opts,
		URLs:    urls,
		Recheck: time.Hour, // only Reload reads the list again
	})
	require.NoError(t, err)
	start(t, d)
	return d, l
}

// A database listed again under another URL (its password rotated: here a
// parameter added) is relayed under the new one: its old fleet stops, its
// LISTEN session forgotten (metrics.Session), before the new one starts. (The new URL was refused, "two listed databases are
// named ...", until the next reading of the list.)
func TestDatabasesFollowADatabaseToItsNewURL(t *testing.T) {
	old := databases(t, 1)[0]
	rotated := anotherURL(t, old, "rotated")
	var mu sync.Mutex
	listed := old
	p := memory.New(memory.Config{})
	session := &sessionRecorder{}
	d, l := startDatabases(t, p, func() ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return []string{listed}, nil
	}, fleet.Options{Session: func(string) fleet.SessionObserver { return session }})
	delivered := func(payload string) func() bool {
		return func() bool {
			return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == payload })
		}
	}
	writeTo(t, old, "a", outbox.Message{Topic: "orders", Payload: []byte("before")})
	dbtest.Eventually(t, time.Minute, "the row under the old URL", delivered("before"))

	mu.Lock()
	listed = rotated
	mu.Unlock()
	d.Reload()
	dbtest.Eventually(t, time.Minute, "the database let go under its old URL", func() bool {
		return strings.Contains(l.String(), "database no longer listed as it was")
	})
	writeTo(t, old, "a", outbox.Message{Topic: "orders", Payload: []byte("after")})
	dbtest.Eventually(t, time.Minute, "the row under the new URL", delivered("after"))
	dbtest.Eventually(t, time.Minute, "the old session forgotten before the new one listens", func() bool {
		told := session.events()
		i := slices.Index(told, "forget")
		return i > 0 && told[0] == "up" && slices.Contains(told[i:], "up")
	})
	require.NotContains(t, l.String(), "two listed databases")
	require.NotContains(t, l.String(), "level=ERROR")
}

// Databases that share a name (each tenant's server holding "app"; here
// one database under two URLs) are refused but the first, with an error
// that says how to name them; named in the list, name=postgres://…, each is
// relayed under its name, which {database} sends its rows under.
func TestDatabasesNamedInTheList(t *testing.T) {
	first := databases(t, 1)[0]
	second := anotherURL(t, first, "other_server")
	var mu sync.Mutex
	listed := []string{first, second}
	p := memory.New(memory.Config{})
	d, l := startDatabases(t, p, func() ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(listed), nil
	}, fleet.Options{Destination: "{database}.{topic}"})
	dbtest.Eventually(t, time.Minute, "the second refused, saying how to name it", func() bool {
		return strings.Contains(l.String(), "two listed databases are named") && strings.Contains(l.String(), "eu1=postgres://")
	})
	require.Equal(t, []string{dbName(first)}, d.Names())

	mu.Lock()
	listed = []string{"eu-1=" + first, "us_2=" + second}
	mu.Unlock()
	d.Reload()
	dbtest.Eventually(t, time.Minute, "both relayed under their names", func() bool { return slices.Equal(d.Names(), []string{"eu-1", "us_2"}) })
	writeTo(t, first, "a", outbox.Message{Topic: "orders", Payload: []byte("named")})
	dbtest.Eventually(t, time.Minute, "the row sent under a listed name", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool {
			return string(m.Payload) == "named" && (m.Topic == "eu-1.orders" || m.Topic == "us_2.orders")
		})
	})
}

// Entries that name no database, or that look named but hold no postgres
// URL, are refused with an error that says so, and the others are relayed:
// neither is handed to the driver, which would read the second as
// keyword=value and send it to the defaults' host. Each refusal is logged
// as the entry's, the list having been read, and one listed while another
// still stands is logged too.
func TestDatabasesRefuseEntriesWithoutAName(t *testing.T) {
	t.Setenv("PGDATABASE", "") // the driver's default for a missing dbname
	good := databases(t, 1)[0]
	p := memory.New(memory.Config{})
	var mu sync.Mutex
	listed := []string{good, "host=127.0.0.1 user=postgres"}
	d, l := startDatabases(t, p, func() ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return listed, nil
	}, fleet.Options{})
	dbtest.Eventually(t, time.Minute, "the entry without a name refused, saying why", func() bool {
		return strings.Contains(l.String(), "has no name in its connection string")
	})
	mu.Lock()
	listed = append(listed, "eu1=mysql://127.0.0.1/app")
	mu.Unlock()
	d.Reload()
	dbtest.Eventually(t, time.Minute, "the entry added since refused too, saying why", func() bool {
		return strings.Contains(l.String(), "is not a postgres:// or postgresql:// URL")
	})
	require.Equal(t, []string{dbName(good)}, d.Names())
	require.Contains(t, l.String(), "a listed database is not relayed")
	require.NotContains(t, l.String(), "reading the list of databases failed", "the list was read")
	require.Equal(t, 1, strings.Count(l.String(), "has no name in its connection string"), "a refusal logged at each reading of the list")
}

// Under a destination that puts the database's name before the topic, a
// database whose name holds the separator is left out: database shop's
// topic eu.orders and database shop.eu's orders would share shop.eu.orders.
// Named in the list without it, it is relayed under that name.
func TestDatabasesRefuseANameThatMakesDestinationsAmbiguous(t *testing.T) {
	good := databases(t, 1)[0]
	u, err := url.Parse(good)
	require.NoError(t, err)
	u.Path = "/shop.eu"
	dotted := u.String()
	_, l := startDatabases(t, memory.New(memory.Config{}), func() ([]string, error) {
		return []string{good, dotted}, nil
	}, fleet.Options{Destination: "{database}.{schema}.{topic}"})
	dbtest.Eventually(t, time.Minute, "the dotted name refused, saying why", func() bool {
		return strings.Contains(l.String(), `the listed database \"shop.eu\" holds \".\"`)
	})
}

// One tenant database down leaves GET /outboxes to the others: its
// outboxes are listed first, marked unreachable, where the whole list
// failed, and with it the console, when an operator needed it.
func TestDatabasesListOutboxesPastADatabaseDown(t *testing.T) {
	good := databases(t, 1)[0]
	srv := dbtest.StartServer(t)
	require.NoError(t, migrate(srv.URL(), outbox.Table{Schema: "a", Name: "outbox"}))
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	startDatabases(t, memory.New(memory.Config{}), func() ([]string, error) {
		return []string{good, srv.URL()}, nil
	}, fleet.Options{Admin: admin.Config{Addr: addr}})
	dbtest.Eventually(t, time.Minute, "both databases' outboxes listed", func() bool {
		resp, err := http.Get("http://" + addr + "/outboxes")
		if err != nil {
			return false // the admin API not listening yet
		}
		defer resp.Body.Close()
		var body map[string]any
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&body) == nil && body["total"] == float64(3)
	})

	srv.Stop()
	code, body := adminGet(t, addr, "/outboxes")
	require.Equal(t, http.StatusOK, code, "%v", body)
	list := body["outboxes"].([]any)
	require.Len(t, list, 3)
	for i, o := range list {
		o := o.(map[string]any)
		down := o["database"] == "postgres"
		require.Equal(t, down, o["database_unreachable"], "%v", o)
		require.Equal(t, down, i == 0, "the outbox of the database down comes first: %v", list)
	}
}

// A relay whose every listed database is left out relays nothing, and
// says so: it is not ready.
func TestDatabasesNoneRelayedIsNotReady(t *testing.T) {
	t.Setenv("PGDATABASE", "")
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	_, l := startDatabases(t, memory.New(memory.Config{}), func() ([]string, error) {
		return []string{"host=127.0.0.1 user=postgres"}, nil
	}, fleet.Options{Admin: admin.Config{Addr: addr}})
	dbtest.Eventually(t, time.Minute, "the entry refused", func() bool {
		return strings.Contains(l.String(), "has no name in its connection string")
	})
	code, body := adminGet(t, addr, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "ready relaying no database: %v", body)
	require.Contains(t, fmt.Sprint(body), "no listed database is relayed")
}

// ListedName takes what an operator writes in a file: whatever it is, it
// does not panic, and what it returns keeps its promises (a name only with
// a postgres URL, the entry whole otherwise).
func FuzzListedName(f *testing.F) {
	for _, s := range []string{"postgres://h/app", "eu1=postgres://h/app", " eu1 = POSTGRESQL://h/app ", "host=h dbname=app",
		"postgres://u:pw=postgres://x@h/app", "eu.1=postgres://h/app", "eu1=postgres:/h", "=", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, entry string) {
		name, conn, err := fleet.ListedName(entry)
		switch {
		case err != nil:
			require.Empty(t, name)
			require.Empty(t, conn)
		case name != "":
			require.True(t, strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://"),
				"named %q with %q: the driver reads a URL by its scheme in lower case alone", name, conn)
			require.LessOrEqual(t, len(name), 63)
			require.NotContains(t, name, ".")
		default:
			trimmed := strings.TrimSpace(entry)
			lower := strings.ToLower(trimmed)
			if strings.HasPrefix(lower, "postgres://") || strings.HasPrefix(lower, "postgresql://") {
				scheme, rest, _ := strings.Cut(trimmed, "://")
				require.Equal(t, strings.ToLower(scheme)+"://"+rest, conn, "a URL given back whole, its scheme in lower case")
			} else {
				require.Equal(t, trimmed, conn)
			}
		}
	})
}

func TestListedName(t *testing.T) {
	for _, c := range []struct{ entry, name, conn, err string }{
		{"postgres://h/app", "", "postgres://h/app", ""},
		{"eu1=postgres://h/app", "eu1", "postgres://h/app", ""},
		{"eu_1-a=postgresql://h/app?sslmode=disable", "eu_1-a", "postgresql://h/app?sslmode=disable", ""},
		{"postgres://h/app?sslmode=disable", "", "postgres://h/app?sslmode=disable", ""}, // its = is the query's
		{"host=h dbname=app", "", "host=h dbname=app", ""},                               // keyword=value
		{" eu1 = POSTGRES://h/app ", "eu1", "postgres://h/app", ""},
		{"PostgreSQL://u:p@h/app?sslmode=require", "", "postgresql://u:p@h/app?sslmode=require", ""},
		{"postgres://u:pw=postgres://x@h/app", "", "postgres://u:pw=postgres://x@h/app", ""}, // a password's =, unnamed
		{"host=postgres.internal", "", "host=postgres.internal", ""},
		{"eu.1=postgres://h/app", "", "", `named "eu.1"`},
		{"=postgres://h/app", "", "", `named ""`},
		{"eu1=postgres:/h/app", "", "", `named "eu1" is not a postgres://`},
		{"eu1=mysql://h/app", "", "", `named "eu1" is not a postgres://`},
	} {
		name, conn, err := fleet.ListedName(c.entry)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.entry)
			continue
		}
		require.NoError(t, err, c.entry)
		require.Equal(t, c.name, name, c.entry)
		require.Equal(t, c.conn, conn, c.entry)
	}
}

// A listed database that does not exist, and a list that cannot be read,
// stop nothing else: the databases relayed go on, and each trouble is logged.
func TestDatabasesGoOnPastABadDatabaseAndAnUnreadableList(t *testing.T) {
	good := databases(t, 1)[0]
	u, err := url.Parse(good)
	require.NoError(t, err)
	u.Path = "/" + strings.TrimPrefix(u.Path, "/") + "_missing"
	missing := u.String()
	var mu sync.Mutex
	var listErr error
	listed := []string{good, missing}
	p := memory.New(memory.Config{})
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	d, l := startDatabases(t, p, func() ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return listed, listErr
	}, fleet.Options{Admin: admin.Config{Addr: addr}})
	dbtest.Eventually(t, time.Minute, "the missing database's listing failing, logged", func() bool {
		return strings.Contains(l.String(), "listing the tenant schemas failed")
	})
	writeTo(t, good, "a", outbox.Message{Topic: "orders", Payload: []byte("past a bad neighbour")})
	dbtest.Eventually(t, time.Minute, "the good database's row", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "past a bad neighbour" })
	})
	// Ready while a database answers; the one that does not is named in the log.
	code, body := adminGet(t, addr, "/readyz")
	require.Equal(t, http.StatusOK, code, "one tenant database down made the relay unready: %v", body)
	require.Contains(t, l.String(), "a listed database does not answer")
	require.Contains(t, l.String(), "database "+dbName(missing)+":")

	// Not ready when no database answers.
	mu.Lock()
	listed = []string{missing}
	mu.Unlock()
	d.Reload()
	dbtest.Eventually(t, time.Minute, "the good database let go", func() bool { _, ok := d.Fleet(dbName(good)); return !ok })
	code, body = adminGet(t, addr, "/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "ready with no database answering: %v", body)

	mu.Lock()
	listed = []string{good, missing}
	mu.Unlock()
	d.Reload()
	dbtest.Eventually(t, time.Minute, "the good database relayed again", func() bool { _, ok := d.Fleet(dbName(good)); return ok })

	mu.Lock()
	listErr = errors.New("tenants.txt: permission denied")
	mu.Unlock()
	d.Reload()
	dbtest.Eventually(t, time.Minute, "the unreadable list logged", func() bool {
		return strings.Contains(l.String(), "reading the list of databases failed")
	})
	writeTo(t, good, "b", outbox.Message{Topic: "orders", Payload: []byte("while the list is unreadable")})
	dbtest.Eventually(t, time.Minute, "the good database still relayed", func() bool {
		return slices.ContainsFunc(p.Messages(), func(m producer.Message) bool { return string(m.Payload) == "while the list is unreadable" })
	})
}

// A database's name may hold any character: the admin API's links to its
// outboxes (GET /outboxes' path, the console's) are escaped, and lead to
// them.
func TestDatabasesLinkToAnOutboxOfAnOddlyNamedDatabase(t *testing.T) {
	name := dbtest.Schema(t) + " odd#1?%;,"
	ctx := context.Background()
	_, err := dbtest.Pool(t).Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := dbtest.Pool(t).Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		require.NoError(t, err)
	})
	u := dbtest.WithDatabase(t, dbtest.URL(t), name)
	require.NoError(t, migrate(u, outbox.Table{Schema: "a", Name: "outbox"}))
	addr := fmt.Sprintf("127.0.0.1:%d", dbtest.FreePort(t))
	startDatabases(t, memory.New(memory.Config{}), func() ([]string, error) { return []string{u}, nil },
		fleet.Options{Admin: admin.Config{Addr: addr}})

	var path string
	dbtest.Eventually(t, time.Minute, "the outbox listed", func() bool {
		resp, err := http.Get("http://" + addr + "/outboxes")
		if err != nil {
			return false // the admin API not listening yet
		}
		defer resp.Body.Close()
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		list, _ := body["outboxes"].([]any)
		if len(list) != 1 {
			return false
		}
		o := list[0].(map[string]any)
		require.Equal(t, name+".a", o["name"])
		path = o["path"].(string)
		return true
	})
	require.Equal(t, "/outboxes/"+url.PathEscape(name+".a")+"/", path)
	code, body := adminGet(t, addr, path+"status")
	require.Equal(t, http.StatusOK, code, "%s: %v", path, body)

	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get("http://" + addr + strings.TrimSuffix(path, "/"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMovedPermanently, resp.StatusCode)
	require.Equal(t, path, resp.Header.Get("Location"))
}
