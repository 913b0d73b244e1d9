// Package bench drains pre-loaded backlogs through the sweeper into the real
// brokers: RabbitMQ with publisher confirms and NATS JetStream with acks (and
// Kafka's kfake, which has no target). Run it
// through `make bench`, which fixes -benchtime=1x and -count=3.
package bench_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outbox-sweeper/sweeper/internal/benchutil"
	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/kafka"
	outboxnats "github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
)

func TestMain(m *testing.M) {
	code := dbtest.Run(m)
	dropTenantTemplate()
	os.Exit(code)
}

const backlog = 100_000

// configs are the sweeper settings each broker is measured with: the defaults,
// and larger pages with more topics in flight, so that each topic's batch is
// 200 messages instead of 50 and more batches overlap their confirms.
var configs = []struct {
	name string
	cfg  outbox.Config
}{
	{"defaults", outbox.Config{}},
	{"page=2000,concurrency=8", outbox.Config{PageSize: 2000, Concurrency: 8}},
}

func forEachConfig(b *testing.B, run func(b *testing.B, cfg outbox.Config)) {
	for _, c := range configs {
		b.Run(c.name, func(b *testing.B) { run(b, c.cfg) })
	}
}

// BenchmarkDrainRabbitMQ: every topic has a bound queue that keeps its newest
// 1,000 messages (rabbitTopology).
func BenchmarkDrainRabbitMQ(b *testing.B) {
	forEachConfig(b, benchmarkDrainRabbitMQ)
}

func benchmarkDrainRabbitMQ(b *testing.B, cfg outbox.Config) {
	url := brokertest.RabbitMQURL(b)
	topics := benchutil.Topics("bench", 10)
	benchutil.Drain(b, backlog, topics, cfg, func(b *testing.B) producer.Producer {
		p, err := rabbitmq.New(rabbitmq.Config{URL: url, Exchange: rabbitTopology(b, url, topics)})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Connect(context.Background()); err != nil {
			b.Fatal(err)
		}
		return p
	})
}

// rabbitTopology declares an exchange of its own and, for each topic, a queue
// bound to it that keeps its newest 1,000 messages (older ones are dropped,
// which RabbitMQ still confirms), so that the broker's memory stays small
// without a consumer competing for the two cores. It returns the exchange.
func rabbitTopology(b *testing.B, url string, topics []string) string {
	b.Helper()
	exchange := brokertest.Name("outbox_bench")
	ch := brokertest.RabbitMQExchange(b, url, exchange)
	var queues []string
	b.Cleanup(func() { // before the exchange goes
		for _, q := range queues {
			_, _ = ch.QueueDelete(q, false, false, false)
		}
	})
	for _, topic := range topics {
		q, err := ch.QueueDeclare("", true, false, false, false, amqp.Table{"x-max-length": int32(1000)})
		if err != nil {
			b.Fatal(err)
		}
		queues = append(queues, q.Name)
		if err := ch.QueueBind(q.Name, topic, exchange, false, nil); err != nil {
			b.Fatal(err)
		}
	}
	return exchange
}

// BenchmarkDrainNATS: one file-backed stream captures every topic and keeps its
// newest 20,000 messages.
func BenchmarkDrainNATS(b *testing.B) {
	forEachConfig(b, benchmarkDrainNATS)
}

func benchmarkDrainNATS(b *testing.B, cfg outbox.Config) {
	url := brokertest.NATSURL(b)
	topics := benchutil.NATSStream(b, url, brokertest.Name("bench"), 10, 20_000)
	benchutil.Drain(b, backlog, topics, cfg, func(b *testing.B) producer.Producer {
		p, err := outboxnats.New(outboxnats.Config{URL: url})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Connect(context.Background()); err != nil {
			b.Fatal(err)
		}
		return p
	})
}

// BenchmarkDrainKafka drains into franz-go's kfake, in this process. There is
// no Kafka server to be had here, and kfake's speed says nothing of a real
// cluster's: the figure is reported, with no target, to show what the sweeper
// and the producer cost beside the other brokers (producer/kafka's
// BenchmarkSend has its allocations per message).
func BenchmarkDrainKafka(b *testing.B) {
	forEachConfig(b, benchmarkDrainKafka)
}

func benchmarkDrainKafka(b *testing.B, cfg outbox.Config) {
	topics := benchutil.Topics("bench", 10)
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topics...))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	benchutil.Drain(b, backlog, topics, cfg, func(b *testing.B) producer.Producer {
		p, err := kafka.New(kafka.Config{Brokers: c.ListenAddrs()})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Connect(context.Background()); err != nil {
			b.Fatal(err)
		}
		return p
	})
}

// BenchmarkLatency: the application commits 1,000 single-row transactions a
// second for 20s while the sweeper binary with its defaults (wake-up on commit
// on) relays them to NATS JetStream or RabbitMQ; the figures are each row's
// time from just before its commit to its arrival at a subscriber, from its
// commit's return, and the commit alone (what the database takes, the floor
// under the rest). With OUTBOX_BENCH_BASE set to a git revision, that
// revision's binary runs too, right after, on the same schema (the current
// migrations): bin=new and bin=base.
func BenchmarkLatency(b *testing.B) {
	bins := []string{build(b, "", "cmd/sweeper")}
	if base := os.Getenv("OUTBOX_BENCH_BASE"); base != "" {
		bins = append(bins, build(b, base, "cmd/sweeper"))
	}
	for _, broker := range []string{"nats", "rabbitmq"} {
		for i, bin := range bins {
			name := "broker=" + broker
			if len(bins) > 1 {
				name += "/bin=" + []string{"new", "base"}[i]
			}
			b.Run(name, func(b *testing.B) {
				for range b.N {
					latency(b, bin, broker)
				}
			})
		}
	}
}

func latency(b *testing.B, bin, broker string) {
	prefix := brokertest.Name("latency")
	var (
		topics []string
		sub    benchutil.Subscriber
		args   []string
	)
	switch broker {
	case "nats":
		url := brokertest.NATSURL(b)
		topics = benchutil.NATSStream(b, url, prefix, 10, 100_000)
		sub = benchutil.NATSSubscriber(url, prefix)
		args = []string{"--producer", "nats", "--nats-url", url}
	case "rabbitmq":
		url := brokertest.RabbitMQURL(b)
		topics = benchutil.Topics(prefix, 10)
		exchange := brokertest.Name("latency")
		sub = benchutil.RabbitMQSubscriber(url, exchange, prefix)
		args = []string{"--producer", "rabbitmq", "--rabbitmq-url", url, "--rabbitmq-exchange", exchange}
	}
	tbl := dbtest.Table(b)
	cmd := sweeperCmd(b, bin, tbl, args...)
	// Latency starts the subscriber, and both it and the sweeper declare the
	// exchange alike; Latency's warm-up rows wait for the sweeper.
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	res := benchutil.Latency(b, tbl, sub, topics, 1000, 20*time.Second)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	b.ReportMetric(ms(res.Quantile(0.5)), "p50-ms")
	b.ReportMetric(ms(res.Quantile(0.99)), "p99-ms")
	b.ReportMetric(ms(res.Quantile(1)), "max-ms")
	b.ReportMetric(ms(res.QuantileFromAck(0.5)), "p50-from-ack-ms")
	b.ReportMetric(ms(res.QuantileFromAck(0.99)), "p99-from-ack-ms")
	b.ReportMetric(ms(res.QuantileCommit(0.5)), "commit-p50-ms")
	b.ReportMetric(ms(res.QuantileCommit(0.99)), "commit-p99-ms")
	b.ReportMetric(res.WriteRate, "commits/s")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkPeakRSSBacklog runs the sweeper binary, built without the race
// detector, with the defaults on a backlog of 1,000,000 rows of 512 bytes over
// 10 topics, relaying to stdout (into /dev/null), and reports the process's
// peak RSS (VmHWM) over the whole drain, and the drain rate.
func BenchmarkPeakRSSBacklog(b *testing.B) {
	const backlog = 1_000_000
	bin := build(b, "", "cmd/sweeper")
	for range b.N {
		tbl := dbtest.Table(b)
		benchutil.Load(b, tbl, backlog, 512, benchutil.Topics("topic", 10))
		var status []byte
		elapsed := drain(b, bin, tbl, 10*time.Minute, func(pid int) {
			var err error
			if status, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err != nil {
				b.Fatal(err)
			}
		})
		var peakKB int64
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				peakKB, _ = strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			}
		}
		if peakKB == 0 {
			b.Fatal("no VmHWM in /proc/<pid>/status")
		}
		b.ReportMetric(float64(peakKB)/1024, "peak-RSS-MB")
		b.ReportMetric(backlog/elapsed.Seconds(), "msg/s")
		b.ReportMetric(0, "ns/op")
	}
}

// ms is d in milliseconds, to the microsecond, as the latency figures are
// reported.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
