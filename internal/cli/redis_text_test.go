package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/internal/syncbuf"
)

// An instance that starts against a Redis already holding a tripped topic that
// is not valid UTF-8 (from an instance over a SQL_ASCII database, or written by
// hand) used to die on every start until someone deleted the key: its first
// tick turned the topic half-open and the metrics hook panicked, which left the
// sweeper dead while the panic waited on a deferred wait, and the metrics
// refresh crashed the process (exit 2) within 15 s. It now starts, serves
// /metrics with the topic escaped, and stops cleanly.
func TestAnInstanceStartsOverARedisHoldingATopicThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	redisURL := brokertest.RedisURL(t)
	client := brokertest.RedisClient(t, redisURL)
	key := "outbox-sweeper:" + tbl.String() + ":topics" // the prefix the run command gives the breaker
	ctx := context.Background()
	t.Cleanup(func() {
		keys, _ := client.Keys(context.Background(), "outbox-sweeper:"+tbl.String()+":*").Result()
		if len(keys) > 0 {
			client.Del(context.Background(), keys...)
		}
	})
	require.NoError(t, client.HSet(ctx, key, "\xff\xfe",
		`{"state":"tripped","ticks_left":0,"cooldown":1,"trips":1,"tripped_at":0,"last_error":"written by hand"}`).Err())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- Main(runCtx, []string{"run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--table", tbl.Name,
			"--redis-url", redisURL, "--admin-addr", addr, "--tick", "100ms"}, &stdout, &stderr, noEnv)
	}()

	scrape := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, raw)
	}
	want := `outbox_topic_tripped{topic="\\xff\\xfe"} 1`
	var got string
	// The instance's start and first tick, on a busy machine.
	dbtest.Eventually(t, 2*time.Minute, "the topic in /metrics", func() bool {
		select {
		case code := <-done:
			t.Fatalf("the instance stopped with exit %d:\n%s", code, stderr.String())
		default:
		}
		got = scrape()
		return strings.HasPrefix(got, "200 ") && strings.Contains(got, want)
	})
	require.Contains(t, got, want, "stderr:\n%s", stderr.String())
	require.Contains(t, stderr.String(), "half-open", "the first tick ended the cooldown and told the hook")

	stop()
	select {
	case code := <-done:
		require.Equal(t, 0, code, stderr.String())
	case <-time.After(time.Minute):
		t.Fatal("the instance did not stop")
	}
}
