package outbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-sweeper/sweeper/internal/dbtest"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/outbox/writer"
	"github.com/outbox-sweeper/sweeper/outbox/writer/otelheaders"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/memory"
)

// A message written under a span carries its trace context in the row and to
// the broker, and the sweeper's send span links to it: the consumer continues
// the trace that began in the application's transaction, and the trace shows
// when the relay sent it.
func TestTraceContextTravelsFromTheWriterThroughTheSweeper(t *testing.T) {
	t.Parallel()
	tbl := dbtest.Table(t)
	ctx := context.Background()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(ctx)
	tracer := tp.Tracer("test")

	w, err := writer.NewWithOptions(tbl, writer.Options{ContextHeaders: otelheaders.TraceContext})
	require.NoError(t, err)
	var writers []trace.SpanContext
	for range 2 {
		spanCtx, span := tracer.Start(ctx, "POST /orders")
		writers = append(writers, span.SpanContext())
		require.NoError(t, pgx.BeginFunc(spanCtx, dbtest.Pool(t), func(tx pgx.Tx) error {
			return w.Write(spanCtx, tx, writer.Message{Topic: "orders", Payload: []byte("x"), Headers: map[string]any{"tenant": "acme"}})
		}))
		span.End()
	}
	// Written outside any span: no header, no link.
	require.NoError(t, w.Write(ctx, dbtest.Pool(t), writer.Message{Topic: "orders", Payload: []byte("untraced")}))
	// A message's own traceparent wins over the context's.
	spanCtx, span := tracer.Start(ctx, "other")
	own := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	require.NoError(t, w.Write(spanCtx, dbtest.Pool(t), writer.Message{Topic: "invoices", Headers: map[string]any{writer.HeaderTraceParent: own}}))
	span.End()

	prod := memory.New(memory.Config{})
	prod.FailTopic("invoices", producer.NewTopicError("not_found", errors.New("no such queue")))
	s, err := outbox.NewSweeper(dbtest.Pool(t), prod, outbox.Config{Table: tbl, Tracer: tracer})
	require.NoError(t, err)
	_, err = s.Sweep(ctx)
	require.NoError(t, err)

	msgs := prod.Messages()
	require.Len(t, msgs, 3)
	for i, m := range msgs[:2] {
		h, err := m.DecodeHeaders()
		require.NoError(t, err)
		require.Equal(t, "acme", h["tenant"], "the message's own headers stay")
		tp, _ := h[writer.HeaderTraceParent].(string)
		require.True(t, strings.HasPrefix(tp, "00-"+writers[i].TraceID().String()+"-"+writers[i].SpanID().String()),
			"message %d carries its writer's trace context to the broker: %q", i, tp)
	}
	h, err := msgs[2].DecodeHeaders()
	require.NoError(t, err)
	require.NotContains(t, h, writer.HeaderTraceParent)

	var sends []sdktrace.ReadOnlySpan
	for _, sp := range rec.Ended() {
		if strings.HasPrefix(sp.Name(), "send ") {
			sends = append(sends, sp)
		}
	}
	require.Len(t, sends, 2, "one span per batch sent")
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range sends {
		byName[sp.Name()] = sp
	}
	orders := byName["send orders"]
	require.NotNil(t, orders)
	require.Equal(t, trace.SpanKindProducer, orders.SpanKind())
	attrs := map[attribute.Key]attribute.Value{}
	for _, a := range orders.Attributes() {
		attrs[a.Key] = a.Value
	}
	require.Equal(t, "memory", attrs["messaging.system"].AsString())
	require.Equal(t, "send", attrs["messaging.operation.type"].AsString())
	require.Equal(t, "orders", attrs["messaging.destination.name"].AsString())
	require.Equal(t, int64(3), attrs["messaging.batch.message_count"].AsInt64())
	var linked []trace.SpanContext
	for _, l := range orders.Links() {
		linked = append(linked, l.SpanContext)
	}
	require.Len(t, linked, 2, "a link per traced message, none for the untraced one")
	for i, sc := range linked {
		require.Equal(t, writers[i].TraceID(), sc.TraceID())
		require.Equal(t, writers[i].SpanID(), sc.SpanID())
	}
	require.Equal(t, codes.Unset, orders.Status().Code)

	invoices := byName["send invoices"]
	require.NotNil(t, invoices)
	require.Equal(t, codes.Error, invoices.Status().Code)
	require.Equal(t, "0af7651916cd43dd8448eb211c80319c", invoices.Links()[0].SpanContext.TraceID().String(), "the message's own traceparent")
	var errType string
	for _, a := range invoices.Attributes() {
		if a.Key == "error.type" {
			errType = a.Value.AsString()
		}
	}
	require.Equal(t, "topic", errType)
}
