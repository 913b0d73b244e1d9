package cli

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outbox-sweeper/sweeper/admin"
	"github.com/outbox-sweeper/sweeper/breaker"
)

// A token with whitespace around it, or of spaces, is refused at start with
// exit 2 and a message that names its variable or flag and what is wrong,
// never the token; before, a trailing newline started fine and then every
// call got 401, and a token of spaces allowed a public bind.
func TestABadAdminTokenIsRefusedAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"OUTBOX_ADMIN_TOKEN": "s3cret\n"}, nil, `OUTBOX_ADMIN_TOKEN (--admin-token): the admin token holds a newline (\n) at its end`},
		{nil, []string{"--admin-token", " ", "--admin-addr", "0.0.0.0:7488"}, "--admin-token: the admin token is 1 bytes of whitespace and nothing else"},
		{nil, []string{"--admin-token", "s3 cret"}, "--admin-token: the admin token holds a space at byte 3 of 7"},
		{nil, []string{"--admin-token", "x", "--admin-token-file", "/nonexistent"}, "--admin-token and --admin-token-file are both set"},
		{nil, []string{"--admin-token-file", "/nonexistent/token"}, "--admin-token-file: cannot read the token"},
		{nil, []string{"--admin-allowed-hosts", "https://sweeper.example"}, `"https://sweeper.example" is not a host name`},
		{nil, []string{"--admin-allowed-hosts", "sweeper.example:7488"}, "without a scheme or a port"},
	} {
		code, _, stderr := runMain(t, envOf(tc.env), append([]string{"run"}, tc.args...)...)
		require.Equal(t, ExitUsage, code, stderr)
		require.Contains(t, stderr, tc.want)
		require.NotContains(t, stderr, "s3cret")
	}
	dir := t.TempDir()
	for name, content := range map[string]string{"spaces": "  \n", "empty": "\n", "inner": "s3cret \n"} {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
		code, _, stderr := runMain(t, noEnv, "run", "--admin-token-file", path)
		require.Equal(t, ExitUsage, code, stderr)
		require.Contains(t, stderr, "--admin-token-file: "+path)
	}
}

// serveAdmin serves the real admin API, with its browser rules, over a topic
// breaker and a broker breaker, for the CLI's commands.
func serveAdmin(t *testing.T, token string) (*httptest.Server, *breaker.Topics, *breaker.Dependency) {
	t.Helper()
	topics := breaker.New(breaker.Settings{})
	dep := breaker.NewDependency(breaker.DependencyConfig{})
	t.Cleanup(func() { _ = dep.Close(context.Background()) })
	srv := httptest.NewServer(admin.Handler(admin.Config{Token: token, Topics: topics, Dependency: dep}))
	t.Cleanup(srv.Close)
	return srv, topics, dep
}

// The operator commands send what the API requires of a change (JSON), with
// a token read from a file (its trailing newline dropped), and trip and reset
// the topics "." and "..", which a URL's path cannot name.
func TestOperatorCommandsPassTheAPIsRules(t *testing.T) {
	t.Parallel()
	srv, topics, dep := serveAdmin(t, "s3cret")
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("s3cret\n"), 0o600))
	run := func(args ...string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		code := Main(ctx, append([]string{args[0], args[1], "--admin-url", srv.URL}, args[2:]...), &out, &errOut, envOf(map[string]string{"OUTBOX_ADMIN_TOKEN_FILE": file}))
		require.Equal(t, ExitOK, code, "%v: %s", args, errOut.String())
		return out.String()
	}
	for _, topic := range []string{".", "..", "orders", "a/b"} {
		run("topics", "trip", "--reason", "by hand", "--", topic)
		require.Equal(t, breaker.StateTripped, topics.State(topic), topic)
		run("topics", "reset", "--", topic)
		require.Equal(t, breaker.StateClosed, topics.State(topic), topic)
	}
	require.Contains(t, run("topics", "list"), "(no tripped topics)")
	run("breaker", "trip", "--reason", "failover")
	require.Equal(t, "failover", dep.Tripped())
	run("breaker", "reset")
	require.Empty(t, dep.Tripped())
}

// A token the client cannot send is refused before any call, exit 2, with
// what is wrong with it; before, the command said the sweeper might not be
// running.
func TestOperatorCommandsSayWhatIsWrongWithTheToken(t *testing.T) {
	t.Parallel()
	srv, _, _ := serveAdmin(t, "s3cret")
	code, _, stderr := runMain(t, envOf(map[string]string{"OUTBOX_ADMIN_TOKEN": "s3cret\n"}), "topics", "list", "--admin-url", srv.URL)
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, `OUTBOX_ADMIN_TOKEN (--admin-token): the admin token holds a newline (\n) at its end`)
	require.Contains(t, stderr, "--admin-token-file")
	require.NotContains(t, stderr, "is the sweeper running")
	code, _, stderr = runMain(t, noEnv, "breaker", "trip", "--admin-token", " ", "--admin-url", srv.URL)
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "whitespace and nothing else")
}

// Spaces around a topic of --topic-max-age are dropped, as an operator who
// writes "codes = 5m" means codes; a topic that is nothing but spaces, and a
// max age under the least one, are refused with the value named.
func TestTopicMaxAgeTrimsAroundTheEqualsSign(t *testing.T) {
	t.Parallel()
	var m map[string]time.Duration
	v := (*topicDurationsValue)(&m)
	require.NoError(t, v.Set("codes = 5m,  prices\t=1m , events =never"))
	require.Equal(t, map[string]time.Duration{"codes": 5 * time.Minute, "prices": time.Minute, "events": -1}, m)
	require.ErrorContains(t, v.Set("codes=5m,codes =1m"), `topic "codes" is given twice`)
	require.ErrorContains(t, v.Set("  =5m"), `"=5m" is not topic=duration`)
	err := v.Set("a=1ns")
	require.ErrorContains(t, err, `"1ns" for topic "a" is shorter than 1ms, the least max age: write at least 1ms, or never`)
	require.NotContains(t, err.Error(), "negative")
	code, _, stderr := runMain(t, noEnv, "run", "--topic-max-age", "a=500us")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, `invalid value "a=500us" for flag --topic-max-age`)
}
