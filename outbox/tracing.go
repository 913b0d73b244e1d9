package outbox

import (
	"bytes"
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-sweeper/sweeper/outbox/writer"
	"github.com/outbox-sweeper/sweeper/producer"
)

// Tracing follows OpenTelemetry's semantic conventions for messaging: one
// span of kind producer per batch sent ("send <topic>"), linked to the span
// each message was written under. Links, not a parent: a batch holds
// messages of many traces, and its send is not part of any one of them. The
// message itself carries its writer's traceparent to the broker (it is one
// of the row's headers), so the consumer's span continues the trace that
// began in the application's transaction.

// MessagingSystem is what a producer may implement to name its broker in
// spans' messaging.system (rabbitmq, kafka, servicebus, nats, …).
type MessagingSystem interface {
	MessagingSystem() string
}

func (s *Sweeper) startSendSpan(ctx context.Context, b producer.Batch) (context.Context, trace.Span) {
	system := "unknown"
	if m, ok := s.producer.(MessagingSystem); ok {
		system = m.MessagingSystem()
	}
	links := make([]trace.Link, 0, len(b.Messages))
	for i := range b.Messages {
		if sc := messageContext(&b.Messages[i]); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return s.cfg.Tracer.Start(ctx, "send "+b.Topic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("messaging.system", system),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.operation.name", "send"),
			attribute.String("messaging.destination.name", b.Topic),
			attribute.Int("messaging.batch.message_count", len(b.Messages)),
		))
}

func endSendSpan(span trace.Span, err error) {
	if err != nil {
		class := producer.ClassOf(err).String()
		span.SetAttributes(attribute.String("error.type", class))
		span.RecordError(err)
		span.SetStatus(codes.Error, class+" failure")
	}
	span.End()
}

var traceParentKey = []byte(`"` + writer.HeaderTraceParent + `"`)

// messageContext returns the span context a message was written under, from
// its traceparent and tracestate headers, or an invalid one. Rows without
// the header (most, when the application does not trace) cost a byte search.
func messageContext(m *producer.Message) trace.SpanContext {
	if !bytes.Contains(m.Headers, traceParentKey) {
		return trace.SpanContext{}
	}
	var h map[string]any
	if json.Unmarshal(m.Headers, &h) != nil {
		return trace.SpanContext{}
	}
	carrier := propagation.MapCarrier{}
	for _, k := range []string{writer.HeaderTraceParent, writer.HeaderTraceState} {
		if v, ok := h[k].(string); ok {
			carrier[k] = v
		}
	}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
}
