package cli

import (
	"bytes"
	"testing"

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
