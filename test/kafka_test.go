package test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// kcatMessage is a record as kcat -J prints it.
type kcatMessage struct {
	Topic     string   `json:"topic"`
	Partition int      `json:"partition"`
	Offset    int64    `json:"offset"`
	Key       *string  `json:"key"`
	Payload   *string  `json:"payload"`
	Headers   []string `json:"headers"` // name, value, name, value, …
}

func (m kcatMessage) header(name string) string {
	for i := 0; i+1 < len(m.Headers); i += 2 {
		if m.Headers[i] == name {
			return m.Headers[i+1]
		}
	}
	return ""
}

// kcat reads every record of topic with kcat (librdkafka), from the start to
// the end of each partition, until it has read at least n.
func kcat(t *testing.T, addr, topic string, n int) []kcatMessage {
	t.Helper()
	path, err := exec.LookPath("kcat")
	require.NoError(t, err, "kcat (Debian's package kcat) reads what the sweeper produced; .ci/run installs it: apt-get install kcat")
	var msgs []kcatMessage
	dbtest.Eventually(t, 2*time.Minute, fmt.Sprintf("kcat reads %d records of %s", n, topic), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, path, "-C", "-b", addr, "-t", topic, "-o", "beginning", "-e", "-J", "-q").Output()
		require.NoError(t, err, "kcat: %s", out)
		msgs = msgs[:0]
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line == "" {
				continue
			}
			var m kcatMessage
			require.NoError(t, json.Unmarshal([]byte(line), &m), "kcat printed %q", line)
			msgs = append(msgs, m)
		}
		return len(msgs) >= n
	})
	return msgs
}

// writeKeyed writes n rows of topic, each with a key of keys (in turn), a seq
// header, a correlation id, a content type and a payload naming its topic and
// seq, from seq from on; it returns their message ids by seq.
func writeKeyed(t *testing.T, tbl outbox.Table, topic string, from, n int, keys int) map[int]string {
	t.Helper()
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	msgs := make([]outbox.Message, n)
	ids := map[int]string{}
	for i := range msgs {
		seq := from + i
		ids[seq] = uuid.NewString()
		msgs[i] = keyedMessage(topic, seq, ids[seq], keys)
	}
	require.NoError(t, w.Write(context.Background(), dbtest.Pool(t), msgs...))
	return ids
}

func keyedMessage(topic string, seq int, id string, keys int) outbox.Message {
	return outbox.Message{Topic: topic, MessageID: id, Payload: fmt.Appendf(nil, "%s/%d", topic, seq),
		Headers: map[string]any{"seq": seq}, CorrelationID: fmt.Sprintf("corr-%d", seq), ContentType: "text/plain",
		PartitionKey: fmt.Sprintf("key-%d", seq%keys)}
}

// checkKeyed checks what kcat read of topic against the rows written: every
// row arrived, with its key, headers and payload; per key (one partition),
// rows came first in seq order; dups says whether a row may come again (after
// an outage: a batch whose acknowledgement was lost is sent again).
func checkKeyed(t *testing.T, msgs []kcatMessage, topic string, ids map[int]string, keys int, dups bool) {
	t.Helper()
	seen := map[string]bool{}
	last := map[string]int{}
	for _, m := range msgs {
		seq, err := strconv.Atoi(m.header("seq"))
		require.NoError(t, err, "seq header of %+v", m)
		id := m.header("message-id")
		require.Equal(t, ids[seq], id, "message id of seq %d", seq)
		require.NotNil(t, m.Key)
		require.Equal(t, fmt.Sprintf("key-%d", seq%keys), *m.Key)
		require.NotNil(t, m.Payload)
		require.Equal(t, fmt.Sprintf("%s/%d", topic, seq), *m.Payload)
		require.Equal(t, fmt.Sprintf("corr-%d", seq), m.header("correlation-id"))
		require.Equal(t, "text/plain", m.header("content-type"))
		if seen[id] {
			require.True(t, dups, "seq %d received twice", seq)
			continue
		}
		seen[id] = true
		if prev, ok := last[*m.Key]; ok {
			require.Greater(t, seq, prev, "key %s: seq %d came after %d", *m.Key, seq, prev)
		}
		last[*m.Key] = seq
	}
	for seq, id := range ids {
		require.True(t, seen[id], "seq %d of %s never arrived", seq, topic)
	}
}

func kafkaArgs(t *testing.T, tbl outbox.Table, addr string, extra ...string) []string {
	return append([]string{"run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema, "--producer", "kafka",
		"--kafka-brokers", addr, "--log-format", "json"}, extra...)
}

// The binary relays to a Kafka cluster that runs as its own process, and kcat,
// a client on librdkafka that has nothing of this project's code, reads every
// record back with its key, headers and payload, each key in id order.
func TestRoundTripKafkaReadByKcat(t *testing.T) {
	t.Parallel()
	const n, keys = 3000, 7
	prefix := brokertest.Name("rt")
	topics := []string{"orders", "payments", "shipments"}
	var names []string
	for _, topic := range topics {
		names = append(names, prefix+"."+topic)
	}
	k := brokertest.StartKafka(t, "--topics", strings.Join(names, ","), "--partitions", "3")
	tbl := migrated(t)
	ids := map[string]map[int]string{}
	for _, topic := range topics {
		ids[topic] = writeKeyed(t, tbl, topic, 0, n/len(topics), keys)
	}
	p := start(t, nil, kafkaArgs(t, tbl, k.Addr, "--kafka-topic-prefix", prefix+".")...)
	dbtest.Eventually(t, 3*time.Minute, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.Stderr())
	for _, topic := range topics {
		msgs := kcat(t, k.Addr, prefix+"."+topic, n/len(topics))
		require.Len(t, msgs, n/len(topics), "topic %s: every row once", topic)
		checkKeyed(t, msgs, topic, ids[topic], keys, false)
	}
}

// Kafka is down when the sweeper starts, comes up, and is killed (SIGKILL)
// mid-run while the application writes, then started again on its data:
// nothing counts an attempt or is dead-lettered while it is down, and every
// row arrives, each key's rows first in id order.
func TestKafkaDownAtStartThenKilledMidRunLosesNothing(t *testing.T) {
	t.Parallel()
	const keys = 5
	prefix := brokertest.Name("outage")
	topic := prefix + ".events"
	port := dbtest.FreePort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	server := []string{"--port", strconv.Itoa(port), "--topics", topic, "--partitions", "3", "--data-dir", t.TempDir()}

	tbl := migrated(t)
	p := start(t, nil, kafkaArgs(t, tbl, addr, "--tick", "200ms", "--max-attempts", "3", "--send-timeout", "2s",
		"--breaker-open-duration", "1s")...)
	ids := writeKeyed(t, tbl, topic, 0, 200, keys)
	dbtest.Eventually(t, time.Minute, "a send failed on the broker", func() bool {
		return strings.Contains(p.Stderr(), `"class":"broker"`)
	})
	requireNothingCharged(t, tbl)

	k := brokertest.StartKafka(t, server...)
	dbtest.Eventually(t, 2*time.Minute, "the rows written while Kafka was down", func() bool { return dbtest.Outstanding(t, tbl) == 0 })

	// Writes go on while the broker is killed and comes back.
	var (
		mu   sync.Mutex
		next = len(ids)
	)
	w, err := outbox.NewWriter(tbl)
	require.NoError(t, err)
	writing, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-writing:
				return
			default:
			}
			mu.Lock()
			var msgs []outbox.Message
			for seq := next; seq < next+20; seq++ {
				ids[seq] = uuid.NewString()
				msgs = append(msgs, keyedMessage(topic, seq, ids[seq], keys))
			}
			next += 20
			mu.Unlock()
			if err := w.Write(context.Background(), dbtest.Pool(t), msgs...); err != nil {
				t.Errorf("write: %v", err)
				return
			}
			// The application's pace: 1,000 rows a second at most, so that the
			// outbox fills while Kafka is down. Every check below waits for an
			// event (rows written, rows outstanding, rows dispatched), so a
			// slower machine only writes fewer rows; the outcome is the same.
			time.Sleep(20 * time.Millisecond)
		}
	}()
	dbtest.Eventually(t, time.Minute, "the application writing", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return next >= 400
	})
	k.Kill()
	dbtest.Eventually(t, time.Minute, "rows piling up while Kafka is down", func() bool { return dbtest.Outstanding(t, tbl) > 100 })
	requireNothingCharged(t, tbl)
	brokertest.StartKafka(t, server...)
	close(writing)
	<-stopped
	dbtest.Eventually(t, 3*time.Minute, "every row dispatched", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	requireNothingCharged(t, tbl)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.Stderr())

	mu.Lock()
	defer mu.Unlock()
	checkKeyed(t, kcat(t, addr, topic, len(ids)), topic, ids, keys, true)
}

// requireNothingCharged checks that no row of tbl counts an attempt and none
// was dead-lettered.
func requireNothingCharged(t *testing.T, tbl outbox.Table) {
	t.Helper()
	var attempted int
	require.NoError(t, dbtest.Pool(t).QueryRow(context.Background(), "SELECT count(*) FROM "+
		dbtest.EveryRow(tbl)+" WHERE attempts > 0").Scan(&attempted))
	require.Zero(t, attempted, "rows charged an attempt for the broker's outage")
	require.Empty(t, deadLetterReasons(t, tbl))
}

// Rows Kafka can never take, beside a healthy topic, on an in-process cluster:
// invalid topic names and a topic that does not exist are refused (their rows
// wait), a row with a reserved header and one over the topic's
// max.message.bytes are dead-lettered; the healthy topic never waits.
func TestPoisonRowsOnKafkaNeverStallTheHealthyTopic(t *testing.T) {
	t.Parallel()
	prefix := brokertest.Name("poison")
	healthy, mixed := prefix+".healthy", prefix+".mixed"
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, healthy))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer admin.Close()
	// The mixed topic takes records of at most 8 KiB.
	create := kmsg.NewPtrCreateTopicsRequest()
	ct := kmsg.NewCreateTopicsRequestTopic()
	ct.Topic, ct.NumPartitions, ct.ReplicationFactor = mixed, 1, 1
	limit := "8192"
	cfg := kmsg.NewCreateTopicsRequestTopicConfig()
	cfg.Name, cfg.Value = "max.message.bytes", &limit
	ct.Configs = append(ct.Configs, cfg)
	create.Topics = append(create.Topics, ct)
	resp, err := create.RequestWith(context.Background(), admin)
	require.NoError(t, err)
	require.NoError(t, kerr.ErrorForCode(resp.Topics[0].ErrorCode))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(healthy, mixed),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	t.Cleanup(cl.Close)

	got := newArrivals()
	ctx, cancel := context.WithCancel(context.Background())
	consumed := make(chan struct{})
	t.Cleanup(func() { cancel(); <-consumed })
	go func() {
		defer close(consumed)
		for ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key == "message-id" {
						got.add(string(h.Value))
					}
				}
			})
		}
	}()

	tbl := migrated(t)
	poison := []poisonRow{
		{name: "topic with a space", msg: outbox.Message{Topic: prefix + ".has space", Payload: []byte("x")}, limit: "a-z A-Z 0-9"},
		{name: "topic of 300 characters", msg: outbox.Message{Topic: prefix + "." + strings.Repeat("t", 300), Payload: []byte("x")}, limit: "249"},
		{name: "topic that does not exist", msg: outbox.Message{Topic: prefix + ".missing", Payload: []byte("x")}, limit: "UNKNOWN_TOPIC_OR_PARTITION"},
		{name: "reserved header", msg: outbox.Message{Topic: mixed, Payload: []byte("x"), Headers: map[string]any{"Message-Id": "forged"}}, deadLettered: true, limit: "message-id"},
		{name: "record over max.message.bytes", msg: outbox.Message{Topic: mixed, Payload: make([]byte, 10_000)}, deadLettered: true,
			reason: "message_too_large", limit: "max.message.bytes of 8192"},
	}
	poisonRun(t, tbl, kafkaArgs(t, tbl, c.ListenAddrs()[0], "--tick", "200ms", "--max-attempts", "3"), healthy, mixed, poison, got)
}

// selfSignedTLS returns a server TLS config for 127.0.0.1 and the PEM of the
// CA that signed it.
func selfSignedTLS(t *testing.T) (*tls.Config, []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, caKey)
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}, MinVersion: tls.VersionTLS12},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// The binary reaches a cluster over TLS verified against --kafka-tls-ca-file
// and authenticates with SASL PLAIN, its password from the environment; with
// a wrong password it charges no row and never prints the password.
func TestKafkaOverTLSWithSASLFromTheBinary(t *testing.T) {
	t.Parallel()
	const password, wrong = "s3cret-Pa55word", "not-the-Pa55word"
	serverTLS, caPEM := selfSignedTLS(t)
	topic := brokertest.Name("tls")
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic), kfake.TLS(serverTLS),
		kfake.EnableSASL(), kfake.Superuser("PLAIN", "sweeper", password))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, caPEM, 0o600))
	args := func(tbl outbox.Table) []string {
		return kafkaArgs(t, tbl, c.ListenAddrs()[0], "--kafka-tls-ca-file", caFile, "--kafka-sasl-mechanism", "plain",
			"--kafka-sasl-username", "sweeper", "--tick", "200ms", "--max-attempts", "3")
	}

	tbl := migrated(t)
	ids := writeKeyed(t, tbl, topic, 0, 50, 5)
	p := start(t, []string{"OUTBOX_KAFKA_SASL_PASSWORD=" + password}, args(tbl)...)
	dbtest.Eventually(t, 2*time.Minute, "every row dispatched over TLS", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.Stderr())
	require.NotContains(t, p.Stderr(), password)

	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
		kgo.SASL(plain.Auth{User: "sweeper", Pass: password}.AsMechanism()))
	require.NoError(t, err)
	defer cl.Close()
	seen := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for len(seen) < len(ids) && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == "message-id" {
					seen[string(h.Value)] = true
				}
			}
		})
	}
	for seq, id := range ids {
		require.True(t, seen[id], "seq %d read back over TLS", seq)
	}

	// A wrong password: the broker's fault to the sweeper, never the rows'.
	tbl = migrated(t)
	writeKeyed(t, tbl, topic, 0, 5, 5)
	p = start(t, []string{"OUTBOX_KAFKA_SASL_PASSWORD=" + wrong}, args(tbl)...)
	dbtest.Eventually(t, time.Minute, "a send failed on the broker", func() bool {
		return strings.Contains(p.Stderr(), `"class":"broker"`)
	})
	require.Equal(t, 5, dbtest.Outstanding(t, tbl))
	requireNothingCharged(t, tbl)
	require.NotContains(t, p.Stderr(), wrong)
}
