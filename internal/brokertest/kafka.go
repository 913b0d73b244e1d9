package brokertest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	kfakeOnce sync.Once
	kfakeBin  string
	kfakeErr  error
)

// KafkaServer is franz-go's kfake running as a process of its own
// (test/kfakeserver): a Kafka cluster that a client of other people's (kcat)
// can read, that a test can kill and start again on its data, and whose
// allocations are not the test process's.
type KafkaServer struct {
	Addr string // host:port of its one broker
	cmd  *exec.Cmd
	done chan struct{}
}

// StartKafka builds test/kfakeserver (once per test binary), starts it with
// args (see its flags) and waits until it listens. The server is killed at
// cleanup.
func StartKafka(t testing.TB, args ...string) *KafkaServer {
	t.Helper()
	kfakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kfakeserver-")
		if err != nil {
			kfakeErr = err
			return
		}
		kfakeBin = filepath.Join(dir, "kfakeserver")
		out, err := exec.Command("go", "build", "-o", kfakeBin, "github.com/outbox-sweeper/sweeper/test/kfakeserver").CombinedOutput()
		if err != nil {
			kfakeErr = fmt.Errorf("build test/kfakeserver: %w\n%s", err, out)
		}
	})
	if kfakeErr != nil {
		t.Fatal(kfakeErr)
	}
	k := &KafkaServer{cmd: exec.Command(kfakeBin, args...), done: make(chan struct{})}
	stdout, err := k.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	k.cmd.Stderr = os.Stderr
	if err := k.cmd.Start(); err != nil {
		t.Fatalf("start kfakeserver: %v", err)
	}
	listening := make(chan string, 1)
	go func() {
		defer close(k.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				listening <- addr
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = k.cmd.Wait() // after every read: Wait closes the pipe
	}()
	t.Cleanup(k.Kill)
	select {
	case k.Addr = <-listening:
	case <-k.done:
		t.Fatalf("kfakeserver %v exited before listening", args)
	case <-time.After(time.Minute):
		t.Fatalf("kfakeserver %v did not listen within a minute", args)
	}
	return k
}

// Kill ends the server at once, as a crash would, and waits for it to end.
func (k *KafkaServer) Kill() {
	_ = k.cmd.Process.Signal(syscall.SIGKILL)
	<-k.done
}
