package cli

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outbox-sweeper/sweeper/alert"
	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// topicBreakerOptions are the flags of the per-topic breaker.
type topicBreakerOptions struct {
	redisURL         string
	cooldown         string
	cooldownMaxTicks int
	cooldownTicks    int
	failureThreshold int
	failureWindow    time.Duration
	maxTrials        int

	// redis is --redis-url's client, made by the first breaker that needs
	// it: a relay of many outboxes shares it among their breakers, one
	// pool of connections to Redis rather than one per tenant.
	redisMu sync.Mutex
	redis   *redis.Client
}

func (o *topicBreakerOptions) register(f *flags) {
	f.String(&o.redisURL, "redis-url", "", "url", "share the topic breaker among sweeper instances through Redis, e.g. redis://host:6379/0; empty keeps it in memory")
	f.String(&o.cooldown, "topic-cooldown", "", "topic=ticks,…", "per-topic cooldowns overriding --topic-cooldown-ticks, e.g. orders=30,payments=5")
	f.Int(&o.cooldownMaxTicks, "topic-cooldown-max-ticks", breaker.MaxCooldownTicksDefault, "cap on a cooldown, which doubles each time a half-open trial fails")
	f.Int(&o.cooldownTicks, "topic-cooldown-ticks", breaker.CooldownTicksDefault, "ticks a tripped topic is left out of paging before one trial batch")
	f.Int(&o.failureThreshold, "topic-failure-threshold", breaker.FailureThresholdDefault, "failed batches within --topic-failure-window that trip a topic (a topic-class failure trips at once)")
	f.Duration(&o.failureWindow, "topic-failure-window", breaker.FailureWindowDefault, "how far back failed batches count toward --topic-failure-threshold")
	f.Int(&o.maxTrials, "topic-max-trials", breaker.MaxTrialsDefault, "half-open topics one sweep tries at most; the rest take their turn in the next sweeps")
}

// build validates the flags and returns the breaker, logging its state changes:
// in memory, or shared through Redis with --redis-url. tick is the interval
// between ticks and sendTimeout the longest send, which size the Redis leases.
// key names the outbox's state in Redis: its table's schema-qualified name, so
// that every relay of that table shares it (a relay of many outboxes of several
// databases puts the database's name first).
// build makes a topic breaker from the flags; onChange is the metrics' hook
// (metrics.Metrics.OnTopicChange, or a Source's for one outbox of many).
func (o *topicBreakerOptions) build(f *flags, logger *slog.Logger, alerter alert.Alerter, onChange func(topic string, from, to breaker.State, reason string),
	key string, tick, sendTimeout time.Duration) (breaker.Breaker, error) {
	settings, err := o.settings(f)
	if err != nil {
		return nil, err
	}
	settings.OnStateChange = alertTopicChanges(outbox.LogTopicStateChange(logger), alerter, onChange)
	if o.redisURL == "" {
		return breaker.New(settings), nil
	}
	client, err := o.redisClient(f, logger)
	if err != nil {
		return nil, err
	}
	return breaker.NewRedis(breaker.RedisConfig{
		Client: client,
		// One shared state per outbox table.
		Prefix:   "outbox-sweeper:" + key,
		Settings: settings,
		// The lease outlives a few ticks, so a slow tick does not hand the
		// count to another instance; a trial outlives a send.
		Lease:    max(3*tick, 10*time.Second),
		TrialTTL: max(2*sendTimeout, breaker.TrialTTLDefault),
		OnRedisError: func(err error) {
			if err != nil {
				logger.Error("redis does not answer; the topic breaker works on local state until it does", "err", err)
			} else {
				logger.Info("redis answers again; topics tripped meanwhile are shared")
			}
		},
	})
}

// settings validates the flags into the breaker's settings, all but
// OnStateChange. A relay of many outboxes calls it once at its start: it
// builds each tenant's breaker as the tenant is found, and a bad flag would
// otherwise leave every tenant out, one error each, the process running.
func (o *topicBreakerOptions) settings(f *flags) (breaker.Settings, error) {
	positive := func(v int, name string) error {
		if v < 1 {
			return usagef("%s is %d: it must be at least 1", f.origin(name), v)
		}
		return nil
	}
	for _, c := range []struct {
		v    int
		name string
	}{{o.cooldownMaxTicks, "topic-cooldown-max-ticks"}, {o.cooldownTicks, "topic-cooldown-ticks"}, {o.failureThreshold, "topic-failure-threshold"}, {o.maxTrials, "topic-max-trials"}} {
		if err := positive(c.v, c.name); err != nil {
			return breaker.Settings{}, err
		}
	}
	if o.cooldownTicks > o.cooldownMaxTicks {
		return breaker.Settings{}, usagef("%s %d is more than %s %d", f.origin("topic-cooldown-ticks"), o.cooldownTicks, f.origin("topic-cooldown-max-ticks"), o.cooldownMaxTicks)
	}
	if o.failureWindow < time.Millisecond {
		return breaker.Settings{}, usagef("%s is %s: it must be at least 1ms", f.origin("topic-failure-window"), o.failureWindow)
	}
	cooldowns := map[string]int{}
	if strings.TrimSpace(o.cooldown) != "" {
		for _, pair := range strings.Split(o.cooldown, ",") {
			topic, ticks, ok := strings.Cut(strings.TrimSpace(pair), "=")
			n, err := strconv.Atoi(strings.TrimSpace(ticks))
			if !ok || strings.TrimSpace(topic) == "" || err != nil || n < 1 || n > o.cooldownMaxTicks {
				return breaker.Settings{}, usagef("invalid entry %q in %s %q: write topic=ticks with 1 ≤ ticks ≤ %d, entries separated by commas (e.g. orders=30,payments=5)",
					pair, f.origin("topic-cooldown"), o.cooldown, o.cooldownMaxTicks)
			}
			if p := textProblem(topic); p != "" {
				return breaker.Settings{}, usagef("topic %q in %s %s; write the entry's topic as the rows spell it", topic, f.origin("topic-cooldown"), p)
			}
			if _, twice := cooldowns[strings.TrimSpace(topic)]; twice {
				return breaker.Settings{}, usagef("topic %q is given twice in %s %q: give each topic one cooldown", strings.TrimSpace(topic),
					f.origin("topic-cooldown"), o.cooldown)
			}
			cooldowns[strings.TrimSpace(topic)] = n
		}
	}
	return breaker.Settings{
		Cooldowns:        cooldowns,
		CooldownTicks:    o.cooldownTicks,
		FailureThreshold: o.failureThreshold,
		FailureWindow:    o.failureWindow,
		MaxCooldownTicks: o.cooldownMaxTicks,
		MaxTrials:        o.maxTrials,
	}, nil
}

// redisClient returns --redis-url's client, making it at the first call.
func (o *topicBreakerOptions) redisClient(f *flags, logger *slog.Logger) (*redis.Client, error) {
	o.redisMu.Lock()
	defer o.redisMu.Unlock()
	if o.redis != nil {
		return o.redis, nil
	}
	opts, err := redis.ParseURL(o.redisURL)
	if err != nil {
		return nil, usagef("invalid value %q for %s: %s; write redis://[user:password@]host:port/db",
			redactURL(o.redisURL), f.origin("redis-url"), redactIn(err.Error(), o.redisURL))
	}
	// Without this go-redis ignores context deadlines, and a Redis that
	// hangs would hold each call for its own timeouts (seconds).
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = 1
	opts.DialTimeout = time.Second
	// go-redis writes its own lines (a dial that failed after its retries, say)
	// to stderr as plain text, which breaks --log-format json; they go through
	// the sweeper's log instead. The logger is the process's: one binary, one
	// Redis URL.
	redis.SetLogger(redisLog{logger: logger, url: o.redisURL})
	o.redis = redis.NewClient(opts)
	return o.redis, nil
}

// redisLog carries go-redis's log lines into slog, at warn (they are about
// connections failing), with the URL's secret taken out of them.
type redisLog struct {
	logger *slog.Logger
	url    string
}

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	msg := strings.TrimSpace(redactIn(fmt.Sprintf(format, v...), l.url))
	l.logger.WarnContext(ctx, "redis client: "+strings.TrimPrefix(msg, "redis: "))
}
