// Package test holds end-to-end tests: they build the sweeper binary and run it
// as an operator would, against the real Postgres, and make things fail around it
// (a killed process, a database that is down or drops its connections).
package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// sweeperBin is the binary under test, built once with the race detector.
var sweeperBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sweeper-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sweeperBin = filepath.Join(dir, "sweeper")
	build := exec.Command("go", "build", "-race", "-o", sweeperBin, "../cmd/sweeper")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build the sweeper binary:", err)
		os.Exit(1)
	}
	code := dbtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running sweeper binary.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	code int

	mu     sync.Mutex
	lines  []string // stdout, a line each
	stderr bytes.Buffer
}

// start runs the binary with args, with no OUTBOX_ variables but extraEnv, and
// kills it at cleanup if it is still running.
func start(t *testing.T, extraEnv []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(sweeperBin, args...), done: make(chan struct{})}
	// Tests run many binaries at once: the admin API stays off unless asked.
	p.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "OUTBOX_ADMIN_ADDR="}, extraEnv...)
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	p.cmd.Stderr = lockedWriter{&p.mu, &p.stderr}
	require.NoError(t, p.cmd.Start())

	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		<-scanned // Wait closes the pipe: read it all first
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("sweeper %v stderr:\n%s", args, p.Stderr())
		}
	})
	return p
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (p *proc) Lines() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.lines...)
}

func (p *proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// terminate sends SIGTERM once the binary can take it, and returns its exit
// code. A process killed and restarted a moment ago may not yet have reached
// main's signal.NotifyContext, and a SIGTERM then kills it outright (exit -1,
// as CI once saw); its first log line comes after the handler is installed.
func (p *proc) terminate(t *testing.T, timeout time.Duration) int {
	t.Helper()
	dbtest.Eventually(t, timeout, "the sweeper's first log line", func() bool {
		select {
		case <-p.done:
			return true
		default:
			return p.Stderr() != ""
		}
	})
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	return p.wait(t, timeout)
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		t.Fatalf("sweeper did not exit within %s", timeout)
		return -1
	}
}

// runOnce runs the binary to completion and returns its exit code and output.
func runOnce(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(sweeperBin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "OUTBOX_ADMIN_ADDR="}
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String(), errOut.String()
}

// relayed is a line of the stdout producer.
type relayed struct {
	ID            int64           `json:"id"`
	MessageID     string          `json:"message_id"`
	Topic         string          `json:"topic"`
	CorrelationID *string         `json:"correlation_id"`
	Headers       json.RawMessage `json:"headers"`
	Payload       []byte          `json:"payload"`
}

func parseLines(t *testing.T, lines []string) []relayed {
	t.Helper()
	out := make([]relayed, len(lines))
	for i, l := range lines {
		require.NoError(t, json.Unmarshal([]byte(l), &out[i]), "stdout line %q", l)
	}
	return out
}

func migrated(t *testing.T) outbox.Table { return dbtest.Table(t) }

func insertRows(t *testing.T, tbl outbox.Table, topic string, n int) {
	t.Helper()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{Topic: topic, Payload: fmt.Appendf(nil, "%s-%d", topic, i), CorrelationID: fmt.Sprintf("c-%d", i)}
	}
	require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), msgs...))
}

// databaseURL returns the test database's URL with its host:port replaced, to
// point the binary at a proxy.
func databaseURLVia(t *testing.T, hostport string) string {
	t.Helper()
	u, err := url.Parse(dbtest.URL(t))
	require.NoError(t, err)
	u.Host = hostport
	return u.String()
}
