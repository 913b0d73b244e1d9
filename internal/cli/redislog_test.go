package cli

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
)

// go-redis's own log lines (here: it cannot dial) reach the sweeper's log as
// JSON with --log-format json, and no line carries the URL's password. Not
// parallel: go-redis has one logger per process, and a parallel test's run
// would take its lines.
func TestRedisClientLinesGoThroughTheLogRedacted(t *testing.T) {
	tbl := dbtest.Table(t)
	const marker = "MARKERpw"
	// A port nothing listens on: Redis never answers, and go-redis says so.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadAddr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--table", tbl.Name,
			"--redis-url", "redis://sweeper:" + marker + "@" + deadAddr + "/0", "--admin-addr", "", "--tick", "50ms",
			"--log-format", "json"}, &stdout, &stderr, noEnv)
	}()
	deadline := time.After(60 * time.Second)
	for !strings.Contains(stderr.String(), `"redis client: `) {
		select {
		case code := <-done:
			t.Fatalf("the sweeper stopped with exit %d:\n%s", code, stderr.String())
		case <-deadline:
			t.Fatalf("no go-redis line within 60s:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond): // the poll's pace; the deadline decides
		}
	}
	stop()
	select {
	case code := <-done:
		require.Equal(t, 0, code, stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatal("the sweeper did not stop")
	}
	out := stdout.String() + stderr.String()
	require.NotContains(t, out, marker)
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var v map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &v), "a log line that is not JSON: %q", line)
	}
	require.Contains(t, stderr.String(), "failed to dial", "the line go-redis wrote")
}
