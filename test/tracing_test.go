package test

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outbox-sweeper/sweeper/internal/brokertest"
	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/outbox/writer"
	"github.com/outbox-sweeper/sweeper/outbox/writer/otelheaders"
)

// collector is an OTLP/HTTP trace receiver: what the binary exports with
// OTEL_EXPORTER_OTLP_ENDPOINT pointed at it.
type collector struct {
	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string
}

func startCollector(t *testing.T) (*collector, string) {
	c := &collector{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		var req coltrace.ExportTraceServiceRequest
		if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					c.service = append(c.service, a.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

// linkedTo returns the send spans of topic linked to traceID.
func (c *collector) linkedTo(topic string, traceID trace.TraceID) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if s.Name != "send "+topic || s.Kind != tracepb.Span_SPAN_KIND_PRODUCER {
			continue
		}
		for _, l := range s.Links {
			if hex.EncodeToString(l.TraceId) == traceID.String() {
				out = append(out, s)
			}
		}
	}
	return out
}

// writeTraced writes one message of topic under a span of its own, through a
// writer that puts the trace context in the row, and returns the span's
// context.
func writeTraced(t *testing.T, tbl outbox.Table, topic string) trace.SpanContext {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("app").Start(context.Background(), "POST /orders")
	defer span.End()
	w, err := writer.NewWithOptions(tbl, writer.Options{ContextHeaders: otelheaders.TraceContext})
	require.NoError(t, err)
	require.NoError(t, w.Write(ctx, dbtest.Pool(t), writer.Message{Topic: topic, Payload: []byte("traced")}))
	return span.SpanContext()
}

var otelEnv = func(endpoint string) []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_SERVICE_NAME=sweeper-under-test"}
}

// The binary, with the standard OTEL_* variables, exports a producer span per
// batch linked to the writer's span, and the RabbitMQ consumer receives the
// writer's traceparent: its span continues the application's trace.
func TestTracingRoundTripRabbitMQ(t *testing.T) {
	t.Parallel()
	url := brokertest.RabbitMQURL(t)
	exchange := brokertest.Name("outbox_trace")
	topic := "orders.traced"
	ch := brokertest.RabbitMQExchange(t, url, exchange)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, topic, exchange, false, nil))
	deliveries, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)

	col, endpoint := startCollector(t)
	tbl := migrated(t)
	writerSpan := writeTraced(t, tbl, topic)
	p := start(t, otelEnv(endpoint), "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema,
		"--producer", "rabbitmq", "--rabbitmq-url", url, "--rabbitmq-exchange", exchange)

	var d amqp.Delivery
	select {
	case d = <-deliveries:
	case <-time.After(2 * time.Minute):
		t.Fatalf("no message consumed; sweeper stderr:\n%s", p.Stderr())
	}
	tp, _ := d.Headers[writer.HeaderTraceParent].(string)
	require.True(t, strings.HasPrefix(tp, "00-"+writerSpan.TraceID().String()+"-"), "the consumer gets the writer's trace context: %q", tp)
	dbtest.Eventually(t, 2*time.Minute, "the send span exported", func() bool { return len(col.linkedTo(topic, writerSpan.TraceID())) == 1 })
	col.mu.Lock()
	require.Contains(t, col.service, "sweeper-under-test", "OTEL_SERVICE_NAME names the resource")
	col.mu.Unlock()
	require.Contains(t, p.Stderr(), "tracing to OTLP")
}

// The same through NATS JetStream: the stored message's headers hold the
// writer's traceparent.
func TestTracingRoundTripNATS(t *testing.T) {
	t.Parallel()
	url := brokertest.NATSURL(t)
	prefix := brokertest.Name("trace")
	topic := prefix + ".orders"
	_, stream := brokertest.PrefixStream(t, url, prefix)

	col, endpoint := startCollector(t)
	tbl := migrated(t)
	writerSpan := writeTraced(t, tbl, topic)
	p := start(t, otelEnv(endpoint), "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema,
		"--producer", "nats", "--nats-url", url)

	cons, err := stream.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	m, err := cons.Next(jetstream.FetchMaxWait(2 * time.Minute))
	require.NoError(t, err, "sweeper stderr:\n%s", p.Stderr())
	tp := m.Headers().Get(writer.HeaderTraceParent)
	require.True(t, strings.HasPrefix(tp, "00-"+writerSpan.TraceID().String()+"-"), "the consumer gets the writer's trace context: %q", tp)
	dbtest.Eventually(t, 2*time.Minute, "the send span exported", func() bool { return len(col.linkedTo(topic, writerSpan.TraceID())) == 1 })
}

// Without OTEL_* the binary traces nothing and says nothing of it; an
// exporter it does not have is refused at start with what to set.
func TestTracingIsOffUnlessConfigured(t *testing.T) {
	t.Parallel()
	tbl := migrated(t)
	writeTraced(t, tbl, "orders")
	p := start(t, nil, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema)
	dbtest.Eventually(t, 2*time.Minute, "the row relayed", func() bool { return dbtest.Outstanding(t, tbl) == 0 })
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute))
	require.NotContains(t, p.Stderr(), "tracing")
	p = start(t, []string{"OTEL_TRACES_EXPORTER=zipkin"}, "run", "--database-url", dbtest.URL(t), "--schema", tbl.Schema)
	require.Equal(t, 2, p.wait(t, time.Minute))
	require.Contains(t, p.Stderr(), `OTEL_TRACES_EXPORTER="zipkin" is not supported`)
}
