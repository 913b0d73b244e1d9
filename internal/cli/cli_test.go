package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// noEnv is an empty environment.
func noEnv(string) (string, bool) { return "", false }

func envOf(kv map[string]string) Env {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok } // a nil map is an empty environment
}

func runMain(t *testing.T, env Env, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a command that got past validation returns at once
	code = Main(ctx, args, &out, &errOut, env)
	return code, out.String(), errOut.String()
}

// Every flag rejects a bad value, given on the command line or through its
// variable, with exit 2 and a message that names the flag and the value.
func TestEveryFlagRejectsABadValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd, flag, value, want string
	}{
		{"run", "breaker-failures", "0", "--breaker-failures is 0: it must be at least 1"},
		{"run", "breaker-open-duration", "0s", "--breaker-open-duration is 0s: it must be at least 1ms"},
		{"run", "breaker-open-duration", "long", `invalid value "long"`},
		{"run", "retry-attempts", "0", "--retry-attempts is 0: it must be at least 1"},
		{"run", "retry-initial", "10s", "--retry-initial 10s is more than --retry-max 5s"},
		{"run", "retry-initial", "0s", "--retry-initial is 0s: it must be at least 1ms"},
		{"run", "retry-max", "1ms", "--retry-initial 200ms is more than --retry-max 1ms"},
		{"run", "dead-letter-limit", "0", "dead-letter limit (--dead-letter-limit) is 0"},
		{"run", "dead-letter-window", "10ms", "dead-letter window (--dead-letter-window) is 10ms: it must be at least 1s"},
		{"run", "max-attempts", "0", "max attempts (--max-attempts) is 0: it must be at least 1, or -1"},
		{"run", "max-attempts", "-2", "max attempts (--max-attempts) is -2"},
		{"run", "admin-addr", "0.0.0.0:8080", "is reachable from other hosts and no --admin-token (OUTBOX_ADMIN_TOKEN) is set"},
		{"run", "admin-addr", "nonsense", `admin address "nonsense" (--admin-addr)`},
		{"run", "alert-webhook-url", "ftp://x", `invalid value for --alert-webhook-url (scheme "ftp", host "x"`},
		{"run", "dlq-alert-threshold", "0", "--dlq-alert-threshold is 0: it must be at least 1"},
		{"run", "dlq-probe-schedule", "often", `invalid value "often" for --dlq-probe-schedule`},
		{"run", "dlq-retention", "-1h", "--dlq-retention is -1h0m0s: it must not be negative"},
		{"run", "retention", "0s", "--retention is 0s: give a duration"},
		{"run", "retention-schedule", "nightly", `invalid value "nightly" for --retention-schedule`},
		{"run", "retention-schedule", "0 0 30 2 *", `invalid value "0 0 30 2 *" for --retention-schedule: it never fires`},
		{"run", "schedule", "0 0 31 4 *", `invalid value "0 0 31 4 *" for --schedule: it never fires`},
		{"run", "dlq-probe-schedule", "0 0 30 2 *", `for --dlq-probe-schedule: it never fires`},
		{"run", "concurrency", "x", `invalid value "x"`},
		{"run", "concurrency", "0", "concurrency (--concurrency) is 0: it must be between 1 and 256"},
		{"run", "concurrency", "1000", "concurrency (--concurrency) is 1000"},
		{"run", "database-url", "postgres://h:notaport/db", "invalid --database-url"},
		{"run", "log-format", "xml", `invalid value "xml"`},
		{"run", "log-level", "loud", `invalid value "loud"`},
		{"run", "page-size", "-5", "page size (--page-size) is -5"},
		{"run", "page-size", "1e3", `invalid value "1e3"`},
		{"run", "producer", "pulsar", `invalid value "pulsar"`},
		{"run", "kafka-sasl-mechanism", "gssapi", `invalid value "gssapi"`},
		{"run", "kafka-max-message-bytes", "1MB", `invalid value "1MB"`},
		{"run", "kafka-idempotent", "maybe", `invalid boolean value "maybe" for --kafka-idempotent`},
		{"run", "redis-url", "http://x", `invalid value "http://x"`},
		{"run", "schedule", "every day", `invalid value "every day" for --schedule`},
		{"run", "schema", "Public", `schema (--schema) is "Public": not a valid name`},
		{"run", "send-timeout", "0s", "send timeout (--send-timeout) is 0s: it must be at least 1ms"},
		{"run", "send-timeout", "fast", `invalid value "fast"`},
		{"run", "shutdown-timeout", "-1s", "shutdown timeout (--shutdown-timeout) is -1s"},
		{"run", "shutdown-timeout", "0", "shutdown timeout (--shutdown-timeout) is 0s: it must be at least 1ms"},
		{"run", "shutdown-timeout", "soon", `invalid value "soon"`},
		{"run", "table", "out-box", `table (--table) is "out-box": not a valid name`},
		{"run", "tick", "0s", "tick (--tick) is 0s: it must be at least 1ms"},
		{"run", "topic-cooldown", "orders", `invalid entry "orders" in --topic-cooldown "orders": write topic=ticks`},
		{"run", "topic-cooldown", "orders=0", `invalid entry "orders=0" in --topic-cooldown`},
		{"run", "topic-cooldown", "orders=5,=3", `invalid entry "=3" in --topic-cooldown`},
		{"run", "topic-cooldown-max-ticks", "0", "--topic-cooldown-max-ticks is 0: it must be at least 1"},
		{"run", "topic-cooldown-max-ticks", "5", "--topic-cooldown-ticks 10 is more than --topic-cooldown-max-ticks 5"},
		{"run", "topic-cooldown-ticks", "-1", "--topic-cooldown-ticks is -1: it must be at least 1"},
		{"run", "topic-failure-threshold", "0", "--topic-failure-threshold is 0: it must be at least 1"},
		{"run", "topic-failure-window", "0s", "--topic-failure-window is 0s: it must be at least 1ms"},
		{"run", "topic-failure-window", "soon", `invalid value "soon"`},
		{"run", "topic-max-trials", "0", "--topic-max-trials is 0: it must be at least 1"},
		{"run", "topic-backoff-max", "0s", "topic backoff max (--topic-backoff-max) is 0s: it must be at least 1ms"},
		{"run", "topic-backoff-max", "later", `invalid value "later"`},
		{"run", "tick", "1", `invalid value "1"`},
		{"run", "max-age", "a day", `invalid value "a day"`},
		{"run", "stall-ticks", "1", "--stall-ticks is 1: it must be at least 2"},
		{"run", "degraded-dead-letters", "0", "--degraded-dead-letters is 0: it must be at least 1, or -1"},
		{"run", "alert-repeat-interval", "0s", "--alert-repeat-interval is 0s: it must be at least 1s"},
		{"run", "alert-group-window", "0s", "--alert-group-window is 0s: give a window such as 1m"},
		{"run", "alert-group-window", "soon", `invalid value "soon"`},
		{"run", "max-age", "-1h", "max age (--max-age) is -1h0m0s: it must be positive"},
		{"run", "topic-max-age", "codes", `"codes" is not topic=duration`},
		{"run", "topic-max-age", "codes=soon", `"soon" for topic "codes" is not a positive duration`},
		{"run", "topic-max-age", "codes=0s", `"0s" for topic "codes" is not a positive duration`},
		{"run", "topic-max-age", "codes=1m,codes=2m", `topic "codes" is given twice`},
		{"run", "topic-cooldown", "orders=3,orders=5", `topic "orders" is given twice in --topic-cooldown "orders=3,orders=5"`},
		{"migrate", "database-url", "postgres://h:notaport/db", "invalid --database-url"},
		{"migrate", "schema", "a b", `schema (--schema) is "a b": not a valid name`},
		{"migrate", "table", "", `table (--table) is "": not a valid name`},
	} {
		t.Run(tc.cmd+" --"+tc.flag+"="+tc.value, func(t *testing.T) {
			t.Parallel()
			code, stdout, stderr := runMain(t, noEnv, tc.cmd, "--"+tc.flag+"="+tc.value)
			require.Equal(t, ExitUsage, code, stderr)
			require.Contains(t, stderr, tc.want)
			require.Contains(t, stderr, "sweeper "+tc.cmd+" --help", "the message says where the flags are")
			require.Empty(t, stdout)
			if strings.HasPrefix(tc.want, "invalid value") {
				require.Contains(t, stderr, "--"+tc.flag, "the message names the flag")
			}

			// The same value through the environment: the message names the
			// variable, so the operator knows where to look.
			code, _, stderr = runMain(t, envOf(map[string]string{envName(tc.flag): tc.value}), tc.cmd)
			require.Equal(t, ExitUsage, code, stderr)
			require.Contains(t, stderr, envName(tc.flag))
			require.Contains(t, stderr, "--"+tc.flag)
			if tc.flag != "alert-webhook-url" { // its path may be its token: never shown
				require.Contains(t, stderr, tc.value)
			}
		})
	}
}

func TestEveryRunFlagIsDocumentedWithItsVariable(t *testing.T) {
	t.Parallel()
	code, help, _ := runMain(t, noEnv, "run", "--help")
	require.Equal(t, ExitOK, code)
	var o runOptions
	f := o.flags()
	require.NotEmpty(t, f.help)
	for _, h := range f.help {
		require.Contains(t, help, "--"+h.name+" ")
		require.Contains(t, help, "env "+envName(h.name)+",")
	}
}

func TestCommandLineWinsOverEnvironment(t *testing.T) {
	t.Parallel()
	var o runOptions
	f := o.flags()
	require.NoError(t, f.parse([]string{"--page-size", "7"}, envOf(map[string]string{"OUTBOX_PAGE_SIZE": "9", "OUTBOX_TICK": "3s"})))
	require.Equal(t, 7, o.pageSize)
	require.Equal(t, "3s", o.tick.String())
	require.True(t, f.set("tick"), "a variable counts as set")
	require.False(t, f.set("concurrency"))
}

// Of two flags that exclude each other, one typed wins over the other's
// variable, as the command line wins everywhere; both typed, or both in the
// environment, are refused.
func TestTheCommandLineWinsOverAPairedFlagsVariable(t *testing.T) {
	t.Parallel()
	var o runOptions
	f := o.flags()
	require.NoError(t, f.parse([]string{"--schedule", "@every 5s"}, envOf(map[string]string{"OUTBOX_TICK": "3s"})))
	cfg, err := o.sweeperConfig(f)
	require.NoError(t, err)
	require.NotNil(t, cfg.Schedule)

	o = runOptions{}
	f = o.flags()
	require.NoError(t, f.parse([]string{"--tick", "2s"}, envOf(map[string]string{"OUTBOX_SCHEDULE": "@every 5s"})))
	cfg, err = o.sweeperConfig(f)
	require.NoError(t, err)
	require.Nil(t, cfg.Schedule)
	require.Equal(t, 2*time.Second, cfg.Tick)

	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("from-file\n"), 0o600))
	f = newFlags("x")
	var token, tokenFile string
	adminTokenFlags(f, &token, &tokenFile, "")
	require.NoError(t, f.parse([]string{"--admin-token-file", file}, envOf(map[string]string{"OUTBOX_ADMIN_TOKEN": "from-env"})))
	got, err := adminToken(f, token, tokenFile)
	require.NoError(t, err)
	require.Equal(t, "from-file", got)

	f = newFlags("x")
	token, tokenFile = "", ""
	adminTokenFlags(f, &token, &tokenFile, "")
	require.NoError(t, f.parse([]string{"--admin-token", "typed"}, envOf(map[string]string{"OUTBOX_ADMIN_TOKEN_FILE": file})))
	got, err = adminToken(f, token, tokenFile)
	require.NoError(t, err)
	require.Equal(t, "typed", got)

	code, _, stderr := runMain(t, envOf(map[string]string{"OUTBOX_TICK": "3s", "OUTBOX_SCHEDULE": "@every 5s"}), "run")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, stderr, "are both set: use one")
}

func TestTickAndScheduleTogetherAreRejected(t *testing.T) {
	t.Parallel()
	code, _, stderr := runMain(t, noEnv, "run", "--tick", "2s", "--schedule", "@every 5s")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, stderr, `--tick 2s and --schedule "@every 5s" are both set: use one`)
}

func TestUnknownCommandAndStrayArgument(t *testing.T) {
	t.Parallel()
	code, _, stderr := runMain(t, noEnv, "sweep")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, stderr, `unknown command "sweep"`)

	code, _, stderr = runMain(t, noEnv, "run", "--tick", "1s", "extra")
	require.Equal(t, ExitUsage, code)
	require.Contains(t, stderr, `unexpected argument "extra"`)
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	code, stdout, _ := runMain(t, noEnv, "help")
	require.Equal(t, ExitOK, code)
	require.Contains(t, stdout, "sweeper migrate")
	code, stdout, _ = runMain(t, noEnv, "run", "-h")
	require.Equal(t, ExitOK, code)
	require.Contains(t, stdout, "--page-size")
	code, stdout, _ = runMain(t, noEnv, "version")
	require.Equal(t, ExitOK, code)
	require.True(t, strings.HasPrefix(stdout, "sweeper "), stdout)
}

// A producer's required settings are checked at start, before anything
// connects, and a missing one names its flag and variable.
func TestProducerSettingsAreValidatedAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--producer", "rabbitmq"}, nil, "--producer rabbitmq needs --rabbitmq-url (OUTBOX_RABBITMQ_URL)"},
		{nil, map[string]string{"OUTBOX_PRODUCER": "rabbitmq"}, "OUTBOX_PRODUCER (--producer) rabbitmq needs --rabbitmq-url (OUTBOX_RABBITMQ_URL)"},
		{[]string{"--producer", "rabbitmq", "--rabbitmq-url", "http://x"}, nil, "invalid URL (--rabbitmq-url)"},
		{[]string{"--producer", "rabbitmq", "--rabbitmq-url", "amqp://x", "--rabbitmq-exchange", ""}, nil, "--rabbitmq-exchange is empty"},
		{[]string{"--producer", "nats"}, nil, "--producer nats needs --nats-url (OUTBOX_NATS_URL)"},
		{[]string{"--producer", "nats", "--nats-url", "localhost:4222"}, nil, `invalid value "localhost:4222" for --nats-url: write nats://host:port`},
		{[]string{"--producer", "nats", "--nats-url", "nats://a:4222,http://b"}, nil, `invalid value "http://b" for --nats-url`},
		{[]string{"--producer", "kafka"}, nil, "--producer kafka needs --kafka-brokers (OUTBOX_KAFKA_BROKERS)"},
		{[]string{"--producer", "kafka", "--kafka-brokers", "kafka://b:9092"}, nil, `invalid value "kafka://b:9092" for --kafka-brokers: write host:port`},
		{[]string{"--producer", "kafka", "--kafka-brokers", "a:9092, b"}, nil, `invalid value "b" for --kafka-brokers`},
		{[]string{"--producer", "kafka", "--kafka-brokers", "a:9092", "--kafka-sasl-mechanism", "plain"}, nil,
			"--kafka-sasl-mechanism plain needs --kafka-sasl-username (OUTBOX_KAFKA_SASL_USERNAME) and --kafka-sasl-password (OUTBOX_KAFKA_SASL_PASSWORD)"},
		{[]string{"--producer", "kafka", "--kafka-brokers", "a:9092"}, map[string]string{"OUTBOX_KAFKA_SASL_PASSWORD": "pw"},
			"set without --kafka-sasl-mechanism (OUTBOX_KAFKA_SASL_MECHANISM)"},
		{[]string{"--producer", "kafka", "--kafka-brokers", "a:9092", "--kafka-sasl-mechanism", "gssapi"}, nil, "--kafka-sasl-mechanism"},
		{[]string{"--producer", "kafka", "--kafka-brokers", "a:9092", "--kafka-tls-ca-file", "/nonexistent/ca.pem"}, nil, "read --kafka-tls-ca-file"},
		{[]string{"--producer", "kafka", "--kafka-brokers", "a:9092", "--kafka-tls-ca-file", "/dev/null"}, nil, "holds no PEM certificate"},
		{[]string{"--producer", "kafka", "--kafka-brokers", "a:9092", "--kafka-max-message-bytes", "100"}, nil, "--kafka-max-message-bytes is 100: it must be at least 512"},
		{[]string{"--producer", "servicebus"}, nil, "needs --servicebus-connection-string (OUTBOX_SERVICEBUS_CONNECTION_STRING) or --servicebus-namespace (OUTBOX_SERVICEBUS_NAMESPACE)"},
		{[]string{"--producer", "servicebus", "--servicebus-namespace", "ns"}, map[string]string{"OUTBOX_SERVICEBUS_CONNECTION_STRING": "x"}, "use one"},
		{[]string{"--producer", "servicebus", "--servicebus-connection-string", "nonsense"}, nil, "invalid connection string (--servicebus-connection-string)"},
		// A broker's setting with another producer chosen (stdout by default)
		// would print the rows and count them sent.
		{nil, map[string]string{"OUTBOX_RABBITMQ_URL": "amqp://x"}, "OUTBOX_RABBITMQ_URL (--rabbitmq-url) is set, but --producer is stdout: " +
			"it configures --producer rabbitmq, and the messages would go to stdout and count as sent; " +
			"set --producer rabbitmq (OUTBOX_PRODUCER) to send them there, or unset OUTBOX_RABBITMQ_URL"},
		{[]string{"--producer", "rabbitmq", "--rabbitmq-url", "amqp://x", "--kafka-brokers", "a:9092"}, nil,
			"--kafka-brokers is set, but --producer is rabbitmq: it configures --producer kafka"},
		{[]string{"--producer", "nats", "--nats-url", "nats://a:4222"}, map[string]string{"OUTBOX_SERVICEBUS_BATCH_BY_KEY": "true"},
			"or unset OUTBOX_SERVICEBUS_BATCH_BY_KEY"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, _, stderr := runMain(t, envOf(tc.env), append([]string{"run"}, tc.args...)...)
			require.Equal(t, ExitUsage, code, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}
}

func TestTopicsCommandUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"topics"}, "topics needs a command"},
		{[]string{"topics", "trip"}, "topics trip needs the topic"},
		{[]string{"topics", "drop", "x"}, `unknown topics command "drop"`},
		{[]string{"topics", "list", "--admin-url", "localhost:8080"}, `invalid value "localhost:8080" for --admin-url`},
	} {
		code, _, stderr := runMain(t, noEnv, tc.args...)
		require.Equal(t, ExitUsage, code, stderr)
		require.Contains(t, stderr, tc.want)
	}
}

// --topic-max-age reads pairs, cuts a topic at its last "=", and reads never
// as no max age (-1); its help shows the value as it was read.
func TestTopicMaxAgeParses(t *testing.T) {
	var m map[string]time.Duration
	v := (*topicDurationsValue)(&m)
	require.NoError(t, v.Set(" codes=5m, a=b=1h ,events=never,"))
	require.Equal(t, map[string]time.Duration{"codes": 5 * time.Minute, "a=b": time.Hour, "events": -1}, m)
	require.Equal(t, "a=b=1h0m0s,codes=5m0s,events=never", v.String())
}

// --topic-max-age takes what an operator types, or a variable holds: nothing
// it is given may panic, and what it accepts it prints back in a form it
// reads the same.
func FuzzTopicMaxAge(f *testing.F) {
	for _, s := range []string{"codes=5m", "a=b=1h,events=never", "=1h", "x=", ",,", "t=-1h", "t=1e400h", "\x00=1s", "é=never,é=1s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var m map[string]time.Duration
		v := (*topicDurationsValue)(&m)
		if err := v.Set(s); err != nil {
			return
		}
		var again map[string]time.Duration
		printed := v.String()
		if strings.Contains(printed, ",") && !strings.Contains(s, ",") {
			t.Fatalf("%q printed as %q", s, printed)
		}
		for topic := range m {
			if strings.Contains(topic, ",") {
				t.Fatalf("topic %q holds a comma", topic)
			}
		}
		if err := (*topicDurationsValue)(&again).Set(printed); err != nil {
			t.Fatalf("%q printed as %q, which does not read back: %v", s, printed, err)
		}
		if len(again) != len(m) {
			t.Fatalf("%q read back as %v, want %v", printed, again, m)
		}
	})
}

// An empty database URL is refused: pgx reads it as libpq's defaults (the
// local socket, the OS user's database), where migrate would make an outbox.
func TestAnEmptyDatabaseURLIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"run", "--database-url", " ", "--admin-addr", ""}, "--database-url is empty: give the outbox's database, e.g. postgres://"},
		{map[string]string{"OUTBOX_DATABASE_URL": ""}, []string{"migrate", "status"}, "OUTBOX_DATABASE_URL (--database-url) is empty"},
		{map[string]string{"OUTBOX_DATABASE_URL": ""}, []string{"migrate"}, "OUTBOX_DATABASE_URL (--database-url) is empty"},
		{map[string]string{"OUTBOX_DATABASE_URL": ""}, []string{"dlq", "list"}, "OUTBOX_DATABASE_URL (--database-url) is empty"},
	} {
		code, _, stderr := runMain(t, envOf(tc.env), tc.args...)
		require.Equal(t, ExitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
}

// A command of one outbox, run where the environment describes a relay of
// many, must be told which: it read public.outbox of the default database.
func TestACommandOfOneOutboxInARelayOfManysEnvironmentNamesIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"OUTBOX_SCHEMAS": "tenant_*"}, []string{"dlq", "list"},
			"OUTBOX_SCHEMAS is set, so this environment is a relay of many outboxes, and this command acts on one: name the tenant's schema with --schema"},
		{map[string]string{"OUTBOX_SCHEMAS": "tenant_*"}, []string{"migrate", "status"}, "name the tenant's schema with --schema"},
		{map[string]string{"OUTBOX_DATABASES": "postgres://a/b"}, []string{"dlq", "purge", "--all", "--schema", "x"},
			"OUTBOX_DATABASES is set, so this environment is a relay of many outboxes, and this command acts on one: name the tenant's database with --database-url"},
	} {
		code, _, stderr := runMain(t, envOf(tc.env), tc.args...)
		require.Equal(t, ExitUsage, code, "%v: %s", tc.args, stderr)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	// Named, it goes on (to the database, which is not there).
	code, _, stderr := runMain(t, envOf(map[string]string{"OUTBOX_SCHEMAS": "tenant_*"}), "migrate", "status", "--schema", "tenant_1",
		"--database-url", "postgres://nobody@127.0.0.1:1/x?connect_timeout=1")
	require.NotEqual(t, ExitOK, code)
	require.NotContains(t, stderr, "relay of many", stderr)
}
