// Package brokertest finds the brokers the tests run against: RabbitMQ and NATS
// with JetStream, as the development machines and CI run them. A test that needs
// a broker that does not answer fails with what to set or start; it never skips.
package brokertest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// Variables that point the tests at other brokers, and the local defaults.
const (
	EnvRabbitMQURL     = "OUTBOX_TEST_RABBITMQ_URL"
	LocalRabbitMQURL   = "amqp://guest:guest@127.0.0.1:5672/"
	EnvNATSURL         = "OUTBOX_TEST_NATS_URL"
	LocalNATSURL       = "nats://127.0.0.1:4222"
	EnvRedisURL        = "OUTBOX_TEST_REDIS_URL"
	LocalRedisURL      = "redis://127.0.0.1:6379/0"
	startRabbitMQ      = "rabbitmq-server -detached"
	startNATSJetStream = "nats-server -js (or `bash .ci/run`, which starts both)"
)

// RabbitMQURL returns the test RabbitMQ's URL, failing t if it does not answer.
func RabbitMQURL(t testing.TB) string {
	t.Helper()
	return find(t, EnvRabbitMQURL, LocalRabbitMQURL, "RabbitMQ", startRabbitMQ)
}

// RedisURL returns the test Redis's URL, failing t if it does not answer.
func RedisURL(t testing.TB) string {
	t.Helper()
	return find(t, EnvRedisURL, LocalRedisURL, "Redis", "redis-server --daemonize yes (or `bash .ci/run`)")
}

// NATSURL returns the test NATS server's URL, failing t if it does not answer.
func NATSURL(t testing.TB) string {
	t.Helper()
	return find(t, EnvNATSURL, LocalNATSURL, "NATS", startNATSJetStream)
}

func find(t testing.TB, env, local, name, start string) string {
	t.Helper()
	u := os.Getenv(env)
	if u == "" {
		u = local
	}
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatalf("%s=%q is not a URL: %v", env, u, err)
	}
	conn, err := net.DialTimeout("tcp", parsed.Host, 3*time.Second)
	if err != nil {
		t.Fatalf("%s does not answer at %s (%v): start it (%s) or point %s at one", name, parsed.Host, err, start, env)
	}
	_ = conn.Close()
	return u
}

// HostPort returns the host:port of a broker URL.
func HostPort(t testing.TB, u string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return parsed.Host
}

// WithHost returns u with its host:port replaced, to route it through a proxy.
func WithHost(t testing.TB, u, hostport string) string {
	t.Helper()
	parsed, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	parsed.Host = hostport
	return parsed.String()
}

// Name returns a name unique to this test run, for exchanges, queues, streams
// and subjects, so tests running at once never share one.
func Name(prefix string) string {
	return fmt.Sprintf("%s_%d_%d_%d", prefix, os.Getpid(), time.Now().UnixNano(), nameSeq.Add(1))
}

var nameSeq atomic.Int64

// RabbitMQExchange connects to the RabbitMQ at url and declares exchange as
// the sweeper's producer does (a durable topic exchange), and returns a
// channel on that connection for the caller's queues. At cleanup it deletes
// the exchange and closes the connection.
func RabbitMQExchange(t testing.TB, url, exchange string) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("connect to RabbitMQ: %v", err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil { // the caller may have closed its own
			_ = ch.ExchangeDelete(exchange, false, false)
		}
		_ = conn.Close()
	})
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("open a RabbitMQ channel: %v", err)
	}
	if err := ch.ExchangeDeclare(exchange, "topic", true, false, false, false, nil); err != nil {
		t.Fatalf("declare exchange %q: %v", exchange, err)
	}
	return ch
}

// CreateStream creates a JetStream stream for a test and deletes it at cleanup.
// It tries up to three times: nats-server 2.9 removes its streams directory when
// the last stream is deleted, and a stream created at that moment fails with
// "could not create storage directory" (seen when tests run in parallel).
func CreateStream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	ctx := context.Background()
	var err error
	for attempt := range 3 {
		var s jetstream.Stream
		if s, err = js.CreateStream(ctx, cfg); err == nil {
			t.Cleanup(func() { _ = js.DeleteStream(context.Background(), cfg.Name) })
			return s
		}
		time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond)
	}
	t.Fatalf("create stream %s: %v", cfg.Name, err)
	return nil
}

// PrefixStream connects to the NATS server at url and creates a stream named
// prefix that captures prefix.>, both ended at cleanup. It returns the
// connection, for the tests that also subscribe, and the stream.
func PrefixStream(t testing.TB, url, prefix string) (*nats.Conn, jetstream.Stream) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect to NATS at %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("JetStream: %v", err)
	}
	return nc, CreateStream(t, js, jetstream.StreamConfig{Name: prefix, Subjects: []string{prefix + ".>"}})
}

// StartRedis runs a Redis server of the test's own on a free port, so the test
// can stop and start it. It returns the URL and functions to stop and start it.
func StartRedis(t *testing.T) (url string, stop, start func()) {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("this test runs its own Redis: install redis-server (bash .ci/run does): %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	var cmd *exec.Cmd
	url = fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	start = func() {
		cmd = exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start redis-server: %v", err)
		}
		redisPIDs.Store(url, cmd.Process.Pid)
		deadline := time.Now().Add(time.Minute) // a busy machine's start; the poll below ends it as soon as it answers
		for {
			c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				_ = c.Close()
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("redis-server on port %d did not start: %v", port, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	stop = func() {
		if cmd != nil && cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			cmd = nil
		}
	}
	start()
	t.Cleanup(stop)
	return url, stop, start
}

var redisPIDs sync.Map // url → pid of a StartRedis server

// RedisPID returns the process id of the server StartRedis runs at url.
func RedisPID(t testing.TB, url string) int {
	t.Helper()
	pid, ok := redisPIDs.Load(url)
	if !ok {
		t.Fatalf("no Redis started by StartRedis at %s", url)
	}
	return pid.(int)
}

// RedisPrefix returns a key prefix of the test's own, name's, and deletes
// every key under it when the test ends.
func RedisPrefix(t testing.TB, client *redis.Client, name string) string {
	t.Helper()
	prefix := Name(name)
	t.Cleanup(func() {
		keys, _ := client.Keys(context.Background(), prefix+":*").Result()
		if len(keys) > 0 {
			client.Del(context.Background(), keys...)
		}
	})
	return prefix
}

// RedisClient returns a client on url, closed at cleanup, configured as the
// sweeper configures its own: context deadlines bound every call (go-redis
// ignores them otherwise) and a failed call is retried once.
func RedisClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = 1
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}
