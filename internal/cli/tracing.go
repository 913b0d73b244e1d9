package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// tracing starts OpenTelemetry tracing when the standard OTEL_* variables ask
// for it, and returns the tracer for the sweeper (nil: off) and the function
// that flushes and stops it. It is on when OTEL_TRACES_EXPORTER is otlp, or
// unset with an OTLP endpoint set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none turn it off. The exporter is OTLP over HTTP
// (http/protobuf), which reads the rest of OTEL_EXPORTER_OTLP_* itself
// (headers, timeout, TLS); the SDK reads OTEL_TRACES_SAMPLER, OTEL_BSP_*,
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
func tracing(ctx context.Context, logger *slog.Logger) (trace.Tracer, func(context.Context) error, error) {
	off := func(context.Context) error { return nil }
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, off, nil
	}
	exporter := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") + os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	switch {
	case exporter == "none", exporter == "" && endpoint == "":
		return nil, off, nil
	case exporter != "" && exporter != "otlp":
		return nil, off, &usageError{msg: fmt.Sprintf("OTEL_TRACES_EXPORTER=%q is not supported: the sweeper exports traces with otlp (or none)", exporter)}
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := os.Getenv(v); p != "" && p != "http/protobuf" {
			return nil, off, &usageError{msg: fmt.Sprintf("%s=%q is not supported: the sweeper sends OTLP over HTTP (http/protobuf); point it at the collector's HTTP port (4318)", v, p)}
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, off, fmt.Errorf("OTLP trace exporter (OTEL_EXPORTER_OTLP_*): %w", err)
	}
	// The sweeper's name and version first, so that OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES, read after, win.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "outbox-sweeper"), attribute.String("service.version", version())),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		logger.Warn("tracing: part of the resource could not be read", "error", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	logger.Info("tracing to OTLP", "endpoint", redactEndpoint(endpoint))
	return tp.Tracer("github.com/outbox-sweeper/sweeper"), tp.Shutdown, nil
}

// redactEndpoint keeps an endpoint's scheme and host for the log: a URL may
// carry credentials.
func redactEndpoint(s string) string {
	if i := strings.Index(s, "@"); i >= 0 {
		if j := strings.Index(s, "://"); j >= 0 && j < i {
			return s[:j+3] + "…@" + s[i+1:]
		}
	}
	return s
}
