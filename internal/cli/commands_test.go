package cli

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// Each command's --help exits 0 and shows that command's flags, not another's.
func TestEachCommandHasItsOwnHelp(t *testing.T) {
	t.Parallel()
	flagsOf := func(c *command) []string {
		f, _, err := c.parse([]string{"--help"}, noEnv)
		require.Error(t, err)
		var names []string
		for _, h := range f.help {
			names = append(names, "--"+h.name+" ")
		}
		return names
	}
	for i := range commands {
		c := &commands[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, h := range []string{"--help", "-h"} {
				code, stdout, stderr := runMain(t, noEnv, append(strings.Fields(c.name), h)...)
				require.Equal(t, ExitOK, code, stderr)
				require.Empty(t, stderr)
				require.Contains(t, stdout, "Usage: sweeper "+c.name)
				for _, name := range flagsOf(c) {
					require.Contains(t, stdout, name)
				}
				// No other command's flags: the 130 lines of run's are run's.
				for j := range commands {
					for _, name := range flagsOf(&commands[j]) {
						if !strings.Contains(strings.Join(flagsOf(c), ""), name) {
							require.NotContains(t, stdout, name, "%s's help shows %s's flag", c.name, commands[j].name)
						}
					}
				}
			}
			_, viaHelp, _ := runMain(t, noEnv, append([]string{"help"}, strings.Fields(c.name)...)...)
			_, viaFlag, _ := runMain(t, noEnv, append(strings.Fields(c.name), "--help")...)
			require.Equal(t, viaFlag, viaHelp, "sweeper help %s", c.name)
		})
	}
	for _, group := range []string{"dlq", "topics"} {
		for _, args := range [][]string{{group, "--help"}, {group, "-h"}, {"help", group}} {
			code, stdout, stderr := runMain(t, noEnv, args...)
			require.Equal(t, ExitOK, code, "%v: %s", args, stderr)
			require.Contains(t, stdout, "Usage: sweeper "+group+" COMMAND")
			for _, c := range subcommands(group) {
				require.Contains(t, stdout, "sweeper "+c.name)
			}
		}
		code, stdout, stderr := runMain(t, noEnv, group)
		require.Equal(t, ExitUsage, code)
		require.Empty(t, stdout)
		require.Contains(t, stderr, group+" needs a command")
		require.Contains(t, stderr, "sweeper "+group+" --help")
	}
	// Help for a command that does not exist is a usage error that names it
	// and the commands there are.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"help", "frobnicate"}, `unknown command "frobnicate": the commands are run, migrate, dlq, topics, breaker, healthcheck, version and help`},
		{[]string{"help", "dlq", "frob"}, `unknown dlq command "frob": the dlq commands are list, replay, purge`},
		{[]string{"help", "topics", "frob"}, `unknown topics command "frob"`},
	} {
		code, stdout, stderr := runMain(t, noEnv, tc.args...)
		require.Equal(t, ExitUsage, code, "%v", tc.args)
		require.Empty(t, stdout, "%v", tc.args)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	code, stdout, _ := runMain(t, noEnv, "--help")
	require.Equal(t, ExitOK, code)
	for _, c := range commands {
		require.Contains(t, stdout, "sweeper "+c.name+" ")
	}
	require.NotContains(t, stdout, "env OUTBOX_", "the overview lists commands, not run's flags")
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--version", "-version", "version"} {
		code, stdout, _ := runMain(t, noEnv, arg)
		require.Equal(t, ExitOK, code)
		require.Equal(t, "sweeper "+version()+"\n", stdout)
	}
}

// Operands and flags come in any order, as people type them; after "--"
// everything is an operand.
func TestFlagsAfterOperands(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"trip", "--reason", "migration", "orders"},
		{"trip", "orders", "--reason", "migration"},
		{"trip", "--reason=migration", "--", "orders"},
	} {
		c, rest, err := lookup(append([]string{"topics"}, args...))
		require.NoError(t, err)
		f, run, err := c.parse(rest, noEnv)
		require.NoError(t, err, "%v", args)
		require.NotNil(t, run)
		require.Equal(t, []string{"orders"}, f.args, "%v", args)
		require.Equal(t, "migration", f.fs.Lookup("reason").Value.String(), "%v", args)
	}
	c, rest, err := lookup([]string{"topics", "reset", "--", "-odd"})
	require.NoError(t, err)
	f, _, err := c.parse(rest, noEnv)
	require.NoError(t, err)
	require.Equal(t, []string{"-odd"}, f.args, "a topic that starts with a dash follows --")

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"topics", "trip", "a", "b"}, `unexpected argument "b": sweeper topics trip takes TOPIC and flags`},
		{[]string{"topics", "reset", "--admin-token", "t"}, "topics reset needs the topic: sweeper topics reset TOPIC [flags]"},
		{[]string{"topics", "list", "orders"}, `unexpected argument "orders": sweeper topics list takes flags only`},
		{[]string{"dlq", "list", "--limit", "5", "extra"}, `unexpected argument "extra": sweeper dlq list takes flags only`},
	} {
		code, _, stderr := runMain(t, noEnv, tc.args...)
		require.Equal(t, ExitUsage, code, stderr)
		require.Contains(t, stderr, tc.want)
	}
}

// A zero age is refused with the rule the admin API applies (outbox.CheckAge):
// --older-than 0s would purge everything, and --since 0s select nothing.
func TestAZeroAgeIsRefused(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"dlq", "purge", "--older-than", "0s"},
		{"dlq", "purge", "--older-than", "0s", "--dry-run"},
		{"dlq", "purge", "--older-than=-1h"},
		{"dlq", "list", "--since", "0s"},
		{"dlq", "replay", "--since", "0"},
	} {
		code, stdout, stderr := runMain(t, noEnv, args...)
		require.Equal(t, ExitUsage, code, "%v: %s", args, stderr)
		require.Empty(t, stdout)
		require.Regexp(t, `--(older-than|since) is (0s, which would select every dead letter or none|-1h0m0s: a duration that selects by age must be positive)`, stderr)
	}
}

func TestHealthcheckUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"OUTBOX_ADMIN_ADDR": ""}, nil, "--admin-addr (OUTBOX_ADMIN_ADDR) is empty: the admin API is off"},
		{nil, []string{"--admin-addr", "nonsense"}, `invalid value "nonsense" for --admin-addr`},
		{nil, []string{"--timeout", "0s"}, "--timeout is 0s"},
	} {
		code, _, stderr := runMain(t, envOf(tc.env), append([]string{"healthcheck"}, tc.args...)...)
		require.Equal(t, ExitUsage, code, stderr)
		require.Contains(t, stderr, tc.want)
	}
}

// healthcheck asks /healthz where the sweeper listens, on loopback for a
// wildcard address, and its exit code says what it heard.
func TestHealthcheckAsksTheAdminAPI(t *testing.T) {
	t.Parallel()
	status := atomic.Int32{}
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	require.NoError(t, err)
	healthcheck := func(env map[string]string, args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), append([]string{"healthcheck"}, args...), &out, &errOut, envOf(env))
		return code, out.String(), errOut.String()
	}

	code, stdout, stderr := healthcheck(nil, "--admin-addr", "127.0.0.1:"+port)
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, stdout, "healthy")
	code, _, stderr = healthcheck(map[string]string{"OUTBOX_ADMIN_ADDR": "0.0.0.0:" + port})
	require.Equal(t, ExitOK, code, "a wildcard address is asked on loopback: %s", stderr)

	status.Store(http.StatusServiceUnavailable)
	code, _, stderr = healthcheck(nil, "--admin-addr", "127.0.0.1:"+port)
	require.Equal(t, ExitFailure, code)
	require.Contains(t, stderr, "503")

	srv.Close()
	code, _, stderr = healthcheck(nil, "--admin-addr", "127.0.0.1:"+port)
	require.Equal(t, ExitFailure, code)
	require.Contains(t, stderr, "is the sweeper running with --admin-addr 127.0.0.1:"+port)
}
