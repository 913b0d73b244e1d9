package outbox

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
)

// Defaults for [Config].
const (
	ConcurrencyDefault      = 4
	DeadLetterLimitDefault  = 100
	DeadLetterWindowDefault = 5 * time.Minute
	MaxAttemptsDefault      = 10
	PageSizeDefault         = 500
	SendTimeoutDefault      = 15 * time.Second
	ShutdownTimeoutDefault  = 10 * time.Second
	TickDefault             = time.Second
	TopicBackoffMaxDefault  = 30 * time.Second
)

// Bounds that Config.Validate enforces. They catch typos (a page of 5,000,000
// rows would hold gigabytes in memory), not taste.
const (
	ConcurrencyMax = 256
	PageSizeMax    = 100_000
)

// Ordering is what order several sweepers on one table keep.
type Ordering string

const (
	// OrderingTopic keeps each topic's rows in id order across sweepers: at
	// most one sweeper sends a topic's batch at a time (a transaction-scoped
	// advisory lock per topic, taken by the page's claim), and a batch is sent
	// whole or not at all, so no batch overtakes an earlier one. Sweepers
	// spread over the topics; one topic is sent by one sweeper at a time.
	OrderingTopic Ordering = "topic"
	// OrderingNone lets sweepers share a topic: a batch sends the rows it could
	// claim and skips those another sweeper holds, so a single busy topic
	// drains with every sweeper, and its messages may arrive out of id order.
	// One sweeper on its own still sends each topic in order.
	OrderingNone Ordering = "none"
)

// Schedule says when the next tick starts. robfig/cron's Schedule satisfies it.
type Schedule interface {
	// Next returns the first tick time after t.
	Next(t time.Time) time.Time
}

// Every returns a schedule that ticks every d.
func Every(d time.Duration) Schedule { return every(d) }

type every time.Duration

func (e every) Next(t time.Time) time.Time { return t.Add(time.Duration(e)) }

// Config configures a [Sweeper]. The zero value of each field means its default.
type Config struct {
	// Concurrency is how many topics are sent at once. The batches of one topic
	// are always sent one after another, in id order. Defaults to
	// ConcurrencyDefault.
	Concurrency int

	// DisableNotify turns off wake-ups on commit. By default the sweeper holds
	// one connection of its own that LISTENs for the outbox's trigger
	// (migration 4), and sweeps as soon as rows are committed; scheduled ticks
	// run all the same, and carry the sweeper while that connection is down.
	// The connection is opened with the pool's connection config.
	DisableNotify bool

	// Ordering says what order holds among sweepers on one table. Defaults to
	// OrderingTopic.
	Ordering Ordering

	// Alerter receives an alert when the dead-letter storm guard stops a topic.
	// Optional.
	Alerter alert.Alerter

	// BrokerBreaker is the dependency breaker the sweeper asks before every
	// send and tells its verdict after (breaker.Dependency implements it).
	// While it is open the sweeper reads no page; while it is half-open it
	// sends one batch alone. Nil: no breaker.
	BrokerBreaker BrokerBreaker

	// Retry is the in-call retry of a batch's send on transient and
	// broker-class failures. Zero fields take breaker.Retry's defaults. The
	// halves of a split batch, and rows already known to fail, are sent once:
	// their failure is expected, and retrying it only delays the topic.
	Retry breaker.Retry

	// TopicBackoffMax caps the wait of a topic after transient failures: a
	// topic whose batch failed transiently (or whose broker was down) is left
	// out of paging for Retry.Initial, doubling with each failure in a row up
	// to TopicBackoffMax, with jitter; a success ends it. Without it, a topic
	// that fails would be tried again at every wake-up on commit. Defaults to
	// TopicBackoffMaxDefault; a negative value turns the backoff off.
	TopicBackoffMax time.Duration

	// DeadLetterLimit and DeadLetterWindow are the storm guard: when more than
	// DeadLetterLimit rows of one topic would be dead-lettered within
	// DeadLetterWindow, something is wrong beyond single messages (a broker
	// error misclassified as the messages' fault would otherwise empty the
	// outbox into the dead-letter table). The sweeper then stops dead-lettering
	// the topic, trips it, and alerts. Default to DeadLetterLimitDefault and
	// DeadLetterWindowDefault; a negative limit disables the guard.
	DeadLetterLimit  int
	DeadLetterWindow time.Duration

	// Logger receives the sweeper's logs. Defaults to discarding them.
	Logger *slog.Logger

	// Observer is told what each sweep does, for metrics. Optional.
	Observer Observer

	// Tracer, when set, records a producer span per batch sent (see
	// tracing.go), linked to the trace context each row carries in its
	// traceparent header. Nil traces nothing and costs nothing.
	Tracer trace.Tracer

	// MaxAttempts is how many times a row may fail alone while the broker is
	// known to be up (see policy.go): the row that reaches it is dead-lettered
	// with reason max_retries_exceeded. Failures the broker is blamed for never
	// count. Defaults to MaxAttemptsDefault; a negative value keeps rows
	// forever.
	MaxAttempts int

	// MaxAge, when positive, is how old (counted from created_at) a row may
	// be and still be sent; TopicMaxAge overrides it per topic, a negative
	// value meaning no max age for that topic. A row past its max age, or past
	// its own expires_at, is never sent: it goes to the dead-letter table with
	// reason expired (ReasonExpired), whether its topic is sending, tripped or
	// cooling down, and whether the broker is up or not (expire.go). Zero:
	// rows never expire by age.
	MaxAge      time.Duration
	TopicMaxAge map[string]time.Duration

	// PageSize is the most rows read per page. Memory use is bounded by it, not by
	// the backlog. Defaults to PageSizeDefault.
	PageSize int

	// Schedule says when ticks start. Defaults to Every(Tick).
	Schedule Schedule

	// SendTimeout bounds one batch's send, from the producer's call to its
	// answer. A send that runs out fails as transient, and its rows count an
	// attempt. The page's transaction stays open meanwhile; it sets its own
	// idle_in_transaction_session_timeout to IdleInTransactionTimeout of this,
	// which overrides the server's for that transaction. Defaults to
	// SendTimeoutDefault.
	SendTimeout time.Duration

	// ShutdownTimeout is how long batches already in flight may take to finish
	// once Run's context is done; after it their sends are cancelled and their
	// rows stay outstanding. Defaults to ShutdownTimeoutDefault.
	ShutdownTimeout time.Duration

	// Table names the outbox. Zero fields take Table's defaults.
	Table Table

	// Tick is the interval between ticks when Schedule is nil. Defaults to
	// TickDefault.
	Tick time.Duration

	// Host, when set, is a process that runs the sweepers of many outboxes
	// (package fleet) and shares its connections among them: Run then opens
	// no listener and no awake lock of its own, sweeps when Host wakes it,
	// takes turns with the other outboxes' sweeps, and parks while its outbox
	// holds nothing (see Host). Nil: the sweeper has its pool to itself.
	Host Host

	// TopicBreaker is the per-topic circuit breaker: topics it has tripped are
	// left out of paging. Defaults to an in-memory breaker with
	// breaker.Settings' defaults that logs its state changes to Logger.
	TopicBreaker breaker.Breaker
}

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Concurrency == 0 {
		c.Concurrency = ConcurrencyDefault
	}
	if c.DeadLetterLimit == 0 {
		c.DeadLetterLimit = DeadLetterLimitDefault
	}
	if c.DeadLetterWindow == 0 {
		c.DeadLetterWindow = DeadLetterWindowDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = MaxAttemptsDefault
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.PageSize == 0 {
		c.PageSize = PageSizeDefault
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = SendTimeoutDefault
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = ShutdownTimeoutDefault
	}
	if c.Tick == 0 {
		c.Tick = TickDefault
	}
	if c.TopicBackoffMax == 0 {
		c.TopicBackoffMax = TopicBackoffMaxDefault
	}
	c.Retry = c.Retry.WithDefaults()
	if c.Schedule == nil {
		c.Schedule = Every(c.Tick)
	}
	if c.TopicBreaker == nil {
		c.TopicBreaker = breaker.New(breaker.Settings{OnStateChange: LogTopicStateChange(c.Logger)})
	}
	if c.Ordering == "" {
		c.Ordering = OrderingTopic
	}
	c.Table = c.Table.WithDefaults()
	return c
}

// Validate reports the first field out of range as a [*ConfigError]. Call it on
// a config with defaults filled in (NewSweeper does): it rejects zeros, so that a
// command line that sets a value to 0 is told so rather than given the default.
func (c Config) Validate() error {
	if c.Concurrency < 1 || c.Concurrency > ConcurrencyMax {
		return configError("concurrency", "concurrency", fmt.Sprint(c.Concurrency), fmt.Sprintf("it must be between 1 and %d", ConcurrencyMax))
	}
	if c.PageSize < 1 || c.PageSize > PageSizeMax {
		return configError("page size", "page-size", fmt.Sprint(c.PageSize), fmt.Sprintf("it must be between 1 and %d", PageSizeMax))
	}
	if c.MaxAttempts == 0 || c.MaxAttempts < -1 {
		return configError("max attempts", "max-attempts", fmt.Sprint(c.MaxAttempts), "it must be at least 1, or -1 to never dead-letter for attempts")
	}
	if c.DeadLetterLimit == 0 || c.DeadLetterLimit < -1 {
		return configError("dead-letter limit", "dead-letter-limit", fmt.Sprint(c.DeadLetterLimit), "it must be at least 1, or -1 to turn the storm guard off")
	}
	if c.DeadLetterWindow < time.Second {
		return configError("dead-letter window", "dead-letter-window", c.DeadLetterWindow.String(), "it must be at least 1s")
	}
	if c.SendTimeout < time.Millisecond {
		return configError("send timeout", "send-timeout", c.SendTimeout.String(), "it must be at least 1ms")
	}
	if c.ShutdownTimeout < time.Millisecond {
		return configError("shutdown timeout", "shutdown-timeout", c.ShutdownTimeout.String(), "it must be at least 1ms (the time batches in flight get to finish)")
	}
	if c.Ordering != OrderingTopic && c.Ordering != OrderingNone {
		return configError("ordering", "ordering", fmt.Sprintf("%q", c.Ordering), `it must be "topic" (per-topic id order across sweepers) or "none"`)
	}
	if c.Tick < time.Millisecond {
		return configError("tick", "tick", c.Tick.String(), "it must be at least 1ms")
	}
	if c.TopicBackoffMax >= 0 && c.TopicBackoffMax < time.Millisecond {
		return configError("topic backoff max", "topic-backoff-max", c.TopicBackoffMax.String(), "it must be at least 1ms")
	}
	if c.MaxAge < 0 {
		return configError("max age", "max-age", c.MaxAge.String(), "it must be positive, such as 24h, or 0 for none")
	}
	for _, t := range slices.Sorted(maps.Keys(c.TopicMaxAge)) {
		if d := c.TopicMaxAge[t]; d == 0 || (d > 0 && d < time.Millisecond) {
			return configError("max age of topic "+strconv.Quote(t), "topic-max-age", d.String(),
				"it must be at least 1ms, or negative (never) to exempt the topic from --max-age")
		}
	}
	if c.Retry.Initial > c.Retry.Max {
		return configError("retry initial", "retry-initial", c.Retry.Initial.String(), fmt.Sprintf("it must not be more than --retry-max (%s)", c.Retry.Max))
	}
	return c.Table.Validate()
}
