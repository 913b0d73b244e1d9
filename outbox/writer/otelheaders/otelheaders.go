// Package otelheaders puts the caller's OpenTelemetry trace context into the
// messages a writer writes, as W3C traceparent and tracestate headers. It is
// a package of its own so that applications that do not trace link nothing
// of OpenTelemetry through the writer.
//
//	w, err := writer.NewWithOptions(table, writer.Options{ContextHeaders: otelheaders.TraceContext})
package otelheaders

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TraceContext returns the W3C trace context of ctx's span as headers
// (writer.HeaderTraceParent, and writer.HeaderTraceState when it has a
// state), or nil when ctx holds no valid span context. It fits
// writer.Options.ContextHeaders.
func TraceContext(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, h)
	return h
}
