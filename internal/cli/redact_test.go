package cli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A URL flag's password never reaches the output, whether the URL parses or
// not, nor through the library error that quotes it.
func TestURLFlagsNeverPrintTheirPassword(t *testing.T) {
	t.Parallel()
	const marker = "MARKERpw"
	for _, tc := range []struct{ flag, value string }{
		{"redis-url", "redis://u:" + marker + "@h:notaport/0"},
		{"redis-url", "redis://u:" + marker + "%zz@h:6379/0"},
		{"redis-url", "http://u:" + marker + "@h:6379/0"},
		{"alert-webhook-url", "ftp://u:" + marker + "@h/x"},
		{"alert-webhook-url", "http://u:" + marker + "%zz@h/x"},
	} {
		code, stdout, stderr := runMain(t, noEnv, "run", "--"+tc.flag+"="+tc.value)
		require.Equal(t, ExitUsage, code, "%s: %s", tc.value, stderr)
		require.NotContains(t, stdout+stderr, marker, tc.value)
		require.True(t, strings.Contains(stderr, "--"+tc.flag), stderr)
	}
}
