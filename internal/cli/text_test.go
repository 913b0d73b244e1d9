package cli

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A topic or filter that no row can hold (bytes that are not UTF-8, or a NUL)
// is refused before anything is sent, with exit 2 and a message that names the
// flag or argument and quotes the value. Before, dlq commands failed on the
// database's "invalid byte sequence" (exit 1), and topics trip reached the
// admin API, which panicked on it.
func TestTopicsAndFiltersThatAreNotUTF8ExitWithUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"topics", "trip", "\xff\xfe"}, `topics trip: the topic "\xff\xfe" is not valid UTF-8`},
		{[]string{"topics", "reset", "orders\xfe"}, `topics reset: the topic "orders\xfe" is not valid UTF-8`},
		{[]string{"topics", "trip", "a\x00b"}, `topics trip: the topic "a\x00b" holds a NUL byte`},
		{[]string{"topics", "trip", "orders", "--reason", "bad\xff"}, `--reason "bad\xff" is not valid UTF-8`},
		{[]string{"dlq", "list", "--topic", "\xff"}, `--topic "\xff" is not valid UTF-8`},
		{[]string{"dlq", "list", "--reason", "x\xfe"}, `--reason "x\xfe" is not valid UTF-8`},
		{[]string{"dlq", "replay", "--topic", "\xff"}, `--topic "\xff" is not valid UTF-8`},
		{[]string{"dlq", "purge", "--topic", "\xff", "--dry-run"}, `--topic "\xff" is not valid UTF-8`},
		{[]string{"dlq", "purge", "--topic", "a\x00"}, `--topic "a\x00" holds a NUL byte`},
		{[]string{"run", "--topic-cooldown", "orders=5,\xff=3"}, `topic "\xff" in --topic-cooldown is not valid UTF-8`},
	} {
		t.Run(strconv.Quote(strings.Join(tc.args, " ")), func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runMain(t, noEnv, tc.args...)
			require.Equal(t, ExitUsage, code, stderr)
			require.Contains(t, stderr, tc.want)
			require.Empty(t, stdout)
		})
	}
	// The dlq message says how to reach such dead letters all the same.
	_, _, stderr := runMain(t, noEnv, "dlq", "list", "--topic", "\xff")
	require.Contains(t, stderr, "by --id")
}

// The table of tripped topics shows a topic with control characters or bytes
// that are not UTF-8 quoted, so that it neither garbles the terminal nor
// passes for another topic; ordinary topics are shown as they are.
func TestTheTrippedTableQuotesTopicsATerminalWouldNotShowAsWritten(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"tripped":[{"topic":"orders","state":"tripped"},{"topic":"red\u001b[31m","state":"tripped"},` +
			`{"topic":"\ufffd\ufffd","state":"half-open"},{"topic":"café","state":"tripped"}]}`))
	}))
	defer srv.Close()
	var out, errOut bytes.Buffer
	code := Main(context.Background(), []string{"topics", "list", "--admin-url", srv.URL}, &out, &errOut, noEnv)
	require.Equal(t, ExitOK, code, errOut.String())
	stdout := out.String()
	require.Contains(t, stdout, "\norders ")
	require.Contains(t, stdout, `"red\x1b[31m"`)
	require.Contains(t, stdout, `"��"`)
	require.Contains(t, stdout, "\ncafé ")
	require.NotContains(t, stdout, "\x1b")

	require.Equal(t, "orders", cell("orders"))
	require.Equal(t, `"\xff\xfe"`, cell("\xff\xfe"))
	require.Equal(t, `"a\tb"`, cell("a\tb"))
	require.Equal(t, "a b", cell("a b"))
}
