package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/stretchr/testify/require"
)

// A topic that is not UTF-8 is logged with its bad bytes escaped, not cut
// short (tint) nor replaced (JSON): the log names the topic in the table.
func TestLogsEscapeInvalidUTF8(t *testing.T) {
	t.Parallel()
	for format, want := range map[string]string{"text": `topic=orders\xff\xfe`, "json": `"topic":"orders\\xff\\xfe"`} {
		var buf bytes.Buffer
		l := (&logOptions{logFormat: format, logLevel: "info"}).logger(&buf)
		l.Info("topic breaker: tripped", "topic", "orders\xff\xfe")
		require.Contains(t, buf.String(), want, format)
	}
}

// JSON logs read as log pipelines expect: durations in seconds, empty lists
// as [], times with their zone; text logs' times carry the zone's offset too.
func TestLogsForPipelines(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := (&logOptions{logFormat: "json", logLevel: "info"}).logger(&buf)
	var none []string
	l.Info("batch failed", "wait", 1500*time.Millisecond, "correlation_ids", none, "ids", []int64{1, 2})
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
	require.Equal(t, 1.5, line["wait"])
	require.Equal(t, []any{}, line["correlation_ids"])
	require.Equal(t, []any{1.0, 2.0}, line["ids"])
	_, err := time.Parse(time.RFC3339Nano, line["time"].(string))
	require.NoError(t, err, "JSON times are RFC 3339, with their zone")

	buf.Reset()
	l = (&logOptions{logFormat: "text", logLevel: "info"}).logger(&buf)
	l.Info("starting")
	require.Regexp(t, `^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (Z|[+-]\d\d:\d\d) INF starting`, buf.String())
}

// A trip an operator made is logged at info and alerted as a warning; one the
// breaker made is logged as a warning and alerted as critical, with its cause.
func TestOperatorTripsLogAndAlertBelowAutomaticOnes(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	logger := (&logOptions{logFormat: "json", logLevel: "info"}).logger(&logs)
	rec := &alertRecorder{}
	b := breaker.New(breaker.Settings{OnStateChange: alertTopicChanges(outbox.LogTopicStateChange(logger), rec,
		func(string, breaker.State, breaker.State, string) {})})
	b.Trip("orders", "downstream migration")
	b.Failure("invoices", 0, true, "topic failure (unroutable): NO_ROUTE - no queue bound to invoices")

	var lines []map[string]any
	for _, raw := range bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n")) {
		var l map[string]any
		require.NoError(t, json.Unmarshal(raw, &l))
		lines = append(lines, l)
	}
	require.Len(t, lines, 2)
	require.Equal(t, "INFO", lines[0]["level"])
	require.Equal(t, "tripped by an operator: downstream migration", lines[0]["reason"])
	require.Equal(t, "WARN", lines[1]["level"])
	require.Equal(t, "topic-class failure: topic failure (unroutable): NO_ROUTE - no queue bound to invoices", lines[1]["reason"])
	require.Len(t, rec.alerts, 2)
	require.Equal(t, alert.Warning, rec.alerts[0].Severity)
	require.Equal(t, alert.Critical, rec.alerts[1].Severity)
	require.Contains(t, rec.alerts[1].Summary, "(unroutable)")
}

type alertRecorder struct{ alerts []alert.Alert }

func (r *alertRecorder) Alert(_ context.Context, a alert.Alert) error {
	r.alerts = append(r.alerts, a)
	return nil
}
