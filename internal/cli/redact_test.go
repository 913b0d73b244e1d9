package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A URL flag's password never reaches the output, whether the URL parses or
// not, nor through the library error that quotes it.
func TestURLFlagsNeverPrintTheirPassword(t *testing.T) {
	t.Parallel()
	const marker = "MARKERpw"
	for _, tc := range []struct {
		flag, value string
		more        []string
	}{
		{"database-url", "postgres://u:" + marker + "@h:notaport/db", nil},
		{"database-url", "postgres://u:" + marker + "%zz@h:5432/db", nil},
		{"rabbitmq-url", "http://u:" + marker + "@h", []string{"--producer", "rabbitmq"}},
		{"rabbitmq-url", "amqp://u:" + marker + "%zz@h", []string{"--producer", "rabbitmq"}},
		{"nats-url", "http://u:" + marker + "@h", []string{"--producer", "nats"}},
		{"nats-url", "nats://a:4222,nats://u:" + marker + "%zz@h:4222", []string{"--producer", "nats"}},
		// NATS's token authentication: the token alone, where a user would be.
		{"nats-url", "nats://" + marker + "@", []string{"--producer", "nats"}},
		{"nats-url", "http://" + marker + "@h:4222", []string{"--producer", "nats"}},
		{"servicebus-connection-string", "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccessKey=" + marker + ";junk", []string{"--producer", "servicebus"}},
		{"kafka-sasl-password", marker, []string{"--producer", "kafka", "--kafka-brokers", "a:9092"}},
		{"kafka-sasl-password", marker, []string{"--producer", "kafka", "--kafka-brokers", "a:9092", "--kafka-sasl-mechanism", "scram-sha-512"}},
		{"redis-url", "redis://u:" + marker + "@h:notaport/0", nil},
		{"redis-url", "redis://u:" + marker + "%zz@h:6379/0", nil},
		{"redis-url", "http://u:" + marker + "@h:6379/0", nil},
		{"alert-webhook-url", "ftp://u:" + marker + "@h/x", nil},
		{"alert-webhook-url", "http://u:" + marker + "%zz@h/x", nil},
		// A webhook's token is in its path (Slack's, Teams').
		{"alert-webhook-url", "hooks.slack.com/services/T0/B0/" + marker, nil},
		{"alert-webhook-url", "ftp://hooks.example.com/services/" + marker + "?token=" + marker, nil},
		{"alert-webhook-url", "https://hooks.example.com/%zz/" + marker, nil},
	} {
		code, stdout, stderr := runMain(t, noEnv, append([]string{"run", "--" + tc.flag + "=" + tc.value}, tc.more...)...)
		require.Equal(t, ExitUsage, code, "%s: %s", tc.value, stderr)
		require.NotContains(t, stdout+stderr, marker, tc.value)
		require.True(t, strings.Contains(stderr, "--"+tc.flag), stderr)
	}
	// topics reaches a running sweeper by URL: a bad one, and one nothing
	// answers (the HTTP client's error quotes it).
	for _, u := range []string{"ftp://u:" + marker + "%zz@127.0.0.1:1", "http://u:" + marker + "@127.0.0.1:1"} {
		var out, errOut bytes.Buffer
		code := Main(context.Background(), []string{"topics", "list", "--admin-url", u}, &out, &errOut, noEnv)
		require.NotEqual(t, ExitOK, code)
		require.NotContains(t, out.String()+errOut.String(), marker, u)
		require.Contains(t, errOut.String(), "--admin-url", errOut.String())
	}
}
