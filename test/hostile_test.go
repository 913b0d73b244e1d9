package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// hostileRow is a row written with plain SQL, as any application may write
// it: values Postgres accepts in each column.
type hostileRow struct {
	name string
	// set holds SQL expressions by column, beside topic and message_id.
	set map[string]string
	// reason is the dead-letter reason the row must get, with a word its
	// error must hold; "" for a row that must be sent.
	reason, holds string
}

// The wedges and their kin, against the binary and NATS: each hostile
// row is written beside a healthy topic that gets a row every 100 ms, and
// between good rows of its own topic. Every healthy and good row arrives; each
// hostile row is sent or dead-lettered with its reason and an error naming
// the column; no sweep fails, the process never dies, and health tells the
// truth: /healthz and /readyz ok, GET /status ok with the dead letters
// counted, the sweep-failure gauge at 0, the dead-letter listing readable.
func TestHostileRowsAreSentOrDeadLetteredAndNeverStopTheRelay(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	prefix := brokertest.Name("hostile")
	healthy, mixed := prefix+".healthy", prefix+".mixed"
	nc, _ := brokertest.PrefixStream(t, url, prefix)
	got := newArrivals()
	sub, err := nc.Subscribe(prefix+".>", func(m *natsgo.Msg) { got.add(m.Header.Get("Nats-Msg-Id")) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())

	tbl := migrated(t)
	ctx := context.Background()
	// Rows written before migration 8, or with its constraint dropped.
	_, err = dbtest.Pool(t).Exec(ctx, fmt.Sprintf("ALTER TABLE %s DROP CONSTRAINT %s_created_at_finite", tbl.Ident(), tbl.Name))
	require.NoError(t, err)

	deep := fmt.Sprintf(`'{"a":%s%s}'`, strings.Repeat("[", 11_000), strings.Repeat("]", 11_000))
	rows := []hostileRow{
		{name: "expires_at infinity", set: map[string]string{"expires_at": "'infinity'"}},
		{name: "expires_at -infinity", set: map[string]string{"expires_at": "'-infinity'"}, reason: "expired", holds: "expires_at"},
		{name: "expires_at in 1970", set: map[string]string{"expires_at": "'1970-01-01'"}, reason: "expired", holds: "expires_at"},
		{name: "expires_at in 294276", set: map[string]string{"expires_at": "'294276-12-31 23:59:59+00'"}},
		{name: "created_at infinity", set: map[string]string{"created_at": "'infinity'"}, reason: "unreadable_row", holds: "created_at is 'infinity'"},
		{name: "created_at -infinity", set: map[string]string{"created_at": "'-infinity'"}, reason: "unreadable_row", holds: "created_at is '-infinity'"},
		{name: "created_at in 4713 BC", set: map[string]string{"created_at": "'4713-01-01 00:00:00+00 BC'"}},
		{name: "created_at in 294276", set: map[string]string{"created_at": "'294276-12-31 23:59:59+00'"}},
		{name: "headers 11,000 deep", set: map[string]string{"headers": deep}, reason: "unreadable_row", holds: "headers"},
		{name: "headers 10,000 deep", set: map[string]string{"headers": fmt.Sprintf(`'{"a":%s%s}'`, strings.Repeat("[", 9_998), strings.Repeat("]", 9_998))}},
		{name: "headers of 2 MB", set: map[string]string{"headers": `jsonb_build_object('big', repeat('v', 2000000))`}, reason: "message_too_large", holds: "max_payload"},
		{name: "odd text everywhere", set: map[string]string{"content_type": `E'text/\u2028plain; ü'`,
			"correlation_id": `E'c\u00e9\u2603 ' || repeat('x', 100)`, "partition_key": `'k''ey'`, "headers": `'{"n": 1e400, "s": "\u2028"}'`}},
	}
	ids := map[int64]hostileRow{}
	var goodIDs []string

	p, base := startWithAdmin(t, tbl, "--producer", "nats", "--nats-url", url, "--tick", "200ms", "--log-format", "json")
	h := writeHealthy(t, tbl, healthy, 100*time.Millisecond)
	dbtest.Eventually(t, 2*time.Minute, "the first healthy rows", func() bool { return h.allArrived(got) })

	for i, r := range rows {
		good := uuid.NewString()
		goodIDs = append(goodIDs, good)
		writeOne(t, tbl, outbox.Message{Topic: mixed, MessageID: good, Payload: fmt.Appendf(nil, "good-%d", i)})
		cols, vals := []string{"topic", "payload", "message_id"}, []string{"$1", `'\x01'`, "$2"}
		for c, v := range r.set {
			cols, vals = append(cols, c), append(vals, v)
		}
		messageID := uuid.NewString()
		var id int64
		require.NoError(t, dbtest.Pool(t).QueryRow(ctx, fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) RETURNING id",
			tbl.Ident(), strings.Join(cols, ", "), strings.Join(vals, ", ")), mixed, messageID).Scan(&id), r.name)
		ids[id] = r
		if r.reason == "" {
			goodIDs = append(goodIDs, messageID)
		}
	}
	last := uuid.NewString()
	goodIDs = append(goodIDs, last)
	writeOne(t, tbl, outbox.Message{Topic: mixed, MessageID: last, Payload: []byte("good-last")})

	dbtest.Eventually(t, 3*time.Minute, "the hostile rows handled and the good ones delivered", func() bool {
		for _, id := range goodIDs {
			if !got.has(id) {
				return false
			}
		}
		return dbtest.Outstanding(t, tbl) <= 1 // at most a healthy row in flight
	})
	after := h.writtenCount() + 20
	dbtest.Eventually(t, 2*time.Minute, "twenty more healthy rows written", func() bool { return h.writtenCount() >= after })
	h.halt()
	dbtest.Eventually(t, 2*time.Minute, "every healthy row", func() bool { return h.allArrived(got) })

	dls := deadLetterReasons(t, tbl)
	dead := 0
	for id, r := range ids {
		d, ok := dls[id]
		if r.reason == "" {
			require.False(t, ok, "%s was dead-lettered (%s: %s)", r.name, d[0], d[1])
			continue
		}
		dead++
		require.True(t, ok, "%s (row %d) was not dead-lettered; stderr:\n%s", r.name, id, p.Stderr())
		require.Equal(t, r.reason, d[0], "%s: %s", r.name, d[1])
		require.Contains(t, d[1], r.holds, "%s: the error names the column", r.name)
		require.Less(t, len(d[1]), 2100, "%s: the error is cut short", r.name)
	}
	require.Len(t, dls, dead, "only the rows that can never be sent were dead-lettered")

	call := func(path string) (int, string) {
		req, err := http.NewRequest(http.MethodGet, base+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer t0ken")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		code, body := call(path)
		require.Equal(t, http.StatusOK, code, "%s: %s", path, body)
	}
	var status struct {
		Health struct {
			Status  string   `json:"status"`
			Reasons []string `json:"reasons"`
		} `json:"health"`
		DeadLetters struct {
			Total int `json:"total"`
		} `json:"dead_letters"`
	}
	dbtest.Eventually(t, time.Minute, "GET /status counts the dead letters", func() bool {
		code, body := call("/status")
		require.Equal(t, http.StatusOK, code, body)
		require.NoError(t, json.Unmarshal([]byte(body), &status))
		return status.DeadLetters.Total == dead
	})
	require.Equal(t, "ok", status.Health.Status, "%q", status.Health.Reasons)
	code, body := call("/dlq?show_payload=true&limit=100")
	require.Equal(t, http.StatusOK, code, body)
	require.True(t, json.Valid([]byte(body)), "the listing is JSON")
	code, body = call("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "outbox_sweeps_failed_consecutive 0")
	require.Empty(t, got.duplicates())

	select {
	case <-p.done:
		t.Fatalf("the sweeper died (exit %d); stderr:\n%s", p.code, p.Stderr())
	default:
	}
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.Stderr())
	require.NotContains(t, p.Stderr(), "panic")
	unreadable := 0
	for _, line := range strings.Split(strings.TrimSpace(p.Stderr()), "\n") {
		var l struct{ Msg, Err string }
		require.NoError(t, json.Unmarshal([]byte(line), &l), "a log line that is not JSON: %q", line)
		require.NotEqual(t, "sweep failed; retrying", l.Msg, "a sweep failed: %s", line)
		if strings.HasPrefix(l.Msg, "row unreadable") {
			unreadable++
		}
	}
	require.Equal(t, 3, unreadable, "each unreadable row is logged")
}
