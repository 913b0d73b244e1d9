package cli

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/metrics"
	"github.com/outbox-sweeper/sweeper/outbox"
	"github.com/outbox-sweeper/sweeper/producer"
	"github.com/outbox-sweeper/sweeper/producer/nats"
	"github.com/outbox-sweeper/sweeper/producer/rabbitmq"
	"github.com/outbox-sweeper/sweeper/producer/servicebus"
	"github.com/outbox-sweeper/sweeper/producer/stdout"
)

// producerNames are the values of --producer.
var producerNames = []string{"stdout", "rabbitmq", "nats", "kafka", "servicebus"}

// producerOptions are the flags that choose and configure the producer, and
// the dependency breaker and retries around it.
type producerOptions struct {
	breakerFailures     int
	breakerOpenDuration time.Duration
	retryAttempts       int
	retryInitial        time.Duration
	retryMax            time.Duration
	topicBackoffMax     time.Duration
	name                string
	kafka               kafkaOptions
	natsURL             string
	natsStreamsRefresh  time.Duration
	rabbitmqExchange    string
	rabbitmqURL         string
	servicebusConnStr   string
	servicebusNamespace string
	servicebusByKey     bool
}

func (o *producerOptions) register(f *flags) {
	f.Int(&o.breakerFailures, "breaker-failures", breaker.BreakerFailuresDefault, "sends in a row (each after its retries) that must fail for the broker's fault to open the broker circuit breaker")
	f.Duration(&o.topicBackoffMax, "topic-backoff-max", outbox.TopicBackoffMaxDefault, "longest wait of a topic after transient failures in a row (it starts at --retry-initial and doubles, with jitter); -1ns turns it off")
	f.Duration(&o.breakerOpenDuration, "breaker-open-duration", breaker.BreakerOpenDurationDefault, "how long the open broker breaker sends nothing before one trial batch")
	f.Int(&o.retryAttempts, "retry-attempts", breaker.RetryAttemptsDefault, "tries of one batch on transient failures, within --send-timeout (1: no retry)")
	f.Duration(&o.retryInitial, "retry-initial", breaker.RetryInitialDefault, "first backoff between tries; it doubles each try, with full jitter; also the first wait of a topic after a transient failure")
	f.Duration(&o.retryMax, "retry-max", breaker.RetryMaxDefault, "longest backoff between tries")
	f.Enum(&o.name, "producer", "stdout", producerNames,
		"where messages go: stdout (one JSON object per message per line), rabbitmq, nats (JetStream), kafka or servicebus (Azure Service Bus)")
	o.kafka.register(f)
	f.String(&o.natsURL, "nats-url", "", "url", "NATS server URL for --producer nats, e.g. nats://127.0.0.1:4222; a stream must capture each topic's subject")
	f.Duration(&o.natsStreamsRefresh, "nats-streams-refresh", nats.StreamsRefreshDefault, "how often --producer nats reads the list of streams again, to refuse at once a subject no stream captures (a subject it does not capture reads it again, at most once a second); -1ns turns the check off, for subjects captured through an account import or a subject mapping")
	f.String(&o.rabbitmqExchange, "rabbitmq-exchange", rabbitmq.ExchangeDefault, "name", "durable topic exchange --producer rabbitmq publishes to (declared at start); the topic is the routing key")
	f.String(&o.rabbitmqURL, "rabbitmq-url", "", "url", "AMQP URL for --producer rabbitmq, e.g. amqp://user:pass@host:5672/vhost")
	f.String(&o.servicebusConnStr, "servicebus-connection-string", "", "string", "Service Bus connection string with send rights for --producer servicebus (prefer the variable: it is a secret)")
	f.Bool(&o.servicebusByKey, "servicebus-batch-by-key", false, "cut every Service Bus batch to one partition_key (session id), as partitioned and session-enabled entities require; without it the producer learns it per entity from the first refusal")
	f.String(&o.servicebusNamespace, "servicebus-namespace", "", "host", "Service Bus namespace (name.servicebus.windows.net) for --producer servicebus, authenticated with Azure's default credential")
}

// build creates the chosen producer. A missing or bad setting is a usage error
// naming its flag.
func (o *producerOptions) build(f *flags, out io.Writer, logger *slog.Logger) (producer.Producer, error) {
	if err := o.foreign(f); err != nil {
		return nil, err
	}
	need := func(value, flag string) error {
		if value == "" {
			return usagef("%s %s needs %s", f.origin("producer"), o.name, f.originOrBoth(flag))
		}
		return nil
	}
	switch o.name {
	case "rabbitmq":
		if err := need(o.rabbitmqURL, "rabbitmq-url"); err != nil {
			return nil, err
		}
		if o.rabbitmqExchange == "" {
			return nil, usagef("%s is empty: name the exchange to publish to", f.origin("rabbitmq-exchange"))
		}
		p, err := rabbitmq.New(rabbitmq.Config{URL: o.rabbitmqURL, Exchange: o.rabbitmqExchange})
		if err != nil {
			// amqp091's parse errors quote the URL, password and all.
			return nil, &usageError{msg: redactIn(err.Error(), o.rabbitmqURL)}
		}
		return p, nil
	case "nats":
		if err := need(o.natsURL, "nats-url"); err != nil {
			return nil, err
		}
		for _, u := range strings.Split(o.natsURL, ",") {
			parsed, err := url.Parse(strings.TrimSpace(u))
			if err != nil || parsed.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, parsed.Scheme) {
				// redactIn, not redactURL: a NATS URL's user may be a token
				// alone (nats://TOKEN@host), which has no password to hide.
				return nil, usagef("invalid value %q for %s: write nats://host:port (or tls://, ws://, wss://), several separated by commas", redactIn(u, u), f.origin("nats-url"))
			}
		}
		if o.natsStreamsRefresh == 0 {
			return nil, usagef("%s is 0: give a duration such as 30s, or -1ns to turn the check off", f.origin("nats-streams-refresh"))
		}
		p, err := nats.New(nats.Config{URL: o.natsURL, StreamsRefresh: o.natsStreamsRefresh})
		if err != nil {
			msg := err.Error()
			for _, u := range strings.Split(o.natsURL, ",") {
				msg = redactIn(msg, strings.TrimSpace(u))
			}
			return nil, &usageError{msg: msg}
		}
		return p, nil
	case "kafka":
		return o.kafka.build(f)
	case "servicebus":
		if o.servicebusConnStr == "" && o.servicebusNamespace == "" {
			return nil, usagef("%s servicebus needs %s or %s", f.origin("producer"),
				f.originOrBoth("servicebus-connection-string"), f.originOrBoth("servicebus-namespace"))
		}
		p, err := servicebus.New(servicebus.Config{ConnectionString: o.servicebusConnStr, Namespace: o.servicebusNamespace,
			BatchByKey: o.servicebusByKey, Logger: logger})
		if err != nil {
			return nil, &usageError{msg: redactAccessKey(err.Error(), o.servicebusConnStr)}
		}
		return p, nil
	default:
		return stdout.New(out, stdout.Config{}), nil
	}
}

// foreign refuses a setting of a producer other than the chosen one (a flag
// named for it, given a value other than its default). Why: with
// OUTBOX_RABBITMQ_URL set and OUTBOX_PRODUCER forgotten, the sweeper started
// as the default stdout producer, printed every row, and moved each to
// history as sent; the broker got nothing (an independent review,
// 2026-11-29).
func (o *producerOptions) foreign(f *flags) error {
	var err error
	f.fs.VisitAll(func(fl *flag.Flag) {
		if err != nil || fl.Value.String() == fl.DefValue {
			return
		}
		for _, name := range producerNames {
			if name == o.name || !strings.HasPrefix(fl.Name, name+"-") {
				continue
			}
			undo := "remove " + f.origin(fl.Name)
			if f.source[fl.Name] == "env" {
				undo = "unset " + envName(fl.Name)
			}
			err = usagef("%s is set, but %s is %s: it configures --producer %s, and the messages would go to %s and count as sent; "+
				"set --producer %s (%s) to send them there, or %s",
				f.origin(fl.Name), f.origin("producer"), o.name, name, o.name, name, envName("producer"), undo)
			return
		}
	})
	return err
}

// buildGuarded builds the producer and its broker breaker and retry; on an
// error nothing is left open.
func (o *producerOptions) buildGuarded(ctx context.Context, f *flags, out io.Writer, logger *slog.Logger, alerter alert.Alerter,
	m *metrics.Metrics) (producer.Producer, *breaker.Dependency, breaker.Retry, error) {
	p, err := o.build(f, out, logger)
	if err != nil {
		return nil, nil, breaker.Retry{}, err
	}
	dep, retry, err := o.guard(f, alerter, m)
	if err != nil {
		_ = p.Close(ctx)
		return nil, nil, breaker.Retry{}, err
	}
	return p, dep, retry, nil
}

// guard validates the breaker and retry flags and returns the broker breaker
// and the in-call retry the sweeper drives. State changes are alerted and
// exported as a metric.
func (o *producerOptions) guard(f *flags, alerter alert.Alerter, m *metrics.Metrics) (*breaker.Dependency, breaker.Retry, error) {
	for _, c := range []struct {
		v    int
		name string
	}{{o.breakerFailures, "breaker-failures"}, {o.retryAttempts, "retry-attempts"}} {
		if c.v < 1 {
			return nil, breaker.Retry{}, usagef("%s is %d: it must be at least 1", f.origin(c.name), c.v)
		}
	}
	for _, c := range []struct {
		v    time.Duration
		name string
	}{{o.breakerOpenDuration, "breaker-open-duration"}, {o.retryInitial, "retry-initial"}, {o.retryMax, "retry-max"}} {
		if c.v < time.Millisecond {
			return nil, breaker.Retry{}, usagef("%s is %s: it must be at least 1ms", f.origin(c.name), c.v)
		}
	}
	if o.retryInitial > o.retryMax {
		return nil, breaker.Retry{}, usagef("%s %s is more than %s %s", f.origin("retry-initial"), o.retryInitial, f.origin("retry-max"), o.retryMax)
	}
	dep := breaker.NewDependency(breaker.DependencyConfig{
		Failures:      o.breakerFailures,
		OpenDuration:  o.breakerOpenDuration,
		Alerter:       alerter,
		OnStateChange: m.OnDependencyChange,
	})
	return dep, breaker.Retry{Attempts: o.retryAttempts, Initial: o.retryInitial, Max: o.retryMax}, nil
}

// connector is a producer that can connect ahead of the first send.
type connector interface {
	Connect(ctx context.Context) error
}

// connectEarly tries the broker once at start, so an operator sees at once
// whether it is reachable. A broker that is down is not fatal: sends connect by
// themselves, and the sweeper retries them.
func connectEarly(ctx context.Context, p producer.Producer, name string, logger *slog.Logger) {
	c, ok := p.(connector)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		logger.Warn("broker not reachable yet; every send will try again", "producer", name, "err", err)
		return
	}
	logger.Info("broker reachable", "producer", name)
}
