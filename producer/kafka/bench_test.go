package kafka_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/outbox-sweeper/sweeper/producer/kafka"
)

// BenchmarkSend produces batches of 500 records of 512 bytes, each with a key
// of 10 and two headers, to a kfake cluster running as a process of its own
// (test/kfakeserver), so that what this process allocates is the producer's
// (franz-go included) alone: allocs/msg and B/msg. Its msg/s says how fast
// kfake is, not a Kafka cluster; there is no target.
func BenchmarkSend(b *testing.B) {
	addr := kfakeServer(b, "bench")
	p, err := kafka.New(kafka.Config{Brokers: []string{addr}})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	ctx := context.Background()
	ms := msgs("bench", 1, 500, func(i int) string { return []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}[i%10] })
	for i := range ms {
		ms[i].Payload = make([]byte, 512)
		ms[i].Headers = []byte(`{"tenant":"acme","seq":12345}`)
		ms[i].CorrelationID = "corr"
	}
	send := func() {
		batches, err := p.Batches(ctx, "bench", ms)
		if err != nil {
			b.Fatal(err)
		}
		for _, batch := range batches {
			if err := p.Send(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
	}
	send() // connected, the topic's limit read
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for range b.N {
		send()
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	n := float64(b.N * len(ms))
	b.ReportMetric(n/b.Elapsed().Seconds(), "msg/s")
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/msg")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n, "B/msg")
}

// kfakeServer builds and starts test/kfakeserver with topics and returns its
// address.
func kfakeServer(b *testing.B, topics string) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "kfakeserver")
	if out, err := exec.Command("go", "build", "-o", bin, "../../test/kfakeserver").CombinedOutput(); err != nil {
		b.Fatalf("build test/kfakeserver: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "--topics", topics, "--partitions", "3")
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if addr, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
			go func() { _ = sc.Scan() }() // drain nothing more, keep the pipe open
			return addr
		}
	}
	b.Fatal("kfakeserver exited before listening")
	return ""
}
