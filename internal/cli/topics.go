package cli

import (
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// topicBreakerOptions are the flags of the per-topic breaker.
type topicBreakerOptions struct {
	cooldown         string
	cooldownMaxTicks int
	cooldownTicks    int
	failureThreshold int
	failureWindow    time.Duration
}

func (o *topicBreakerOptions) register(f *flags) {
	f.String(&o.cooldown, "topic-cooldown", "", "topic=ticks,…", "per-topic cooldowns overriding --topic-cooldown-ticks, e.g. orders=30,payments=5")
	f.Int(&o.cooldownMaxTicks, "topic-cooldown-max-ticks", breaker.MaxCooldownTicksDefault, "cap on a cooldown, which doubles each time a half-open trial fails")
	f.Int(&o.cooldownTicks, "topic-cooldown-ticks", breaker.CooldownTicksDefault, "ticks a tripped topic is left out of paging before one trial batch")
	f.Int(&o.failureThreshold, "topic-failure-threshold", breaker.FailureThresholdDefault, "failed batches within --topic-failure-window that trip a topic (a topic-class failure trips at once)")
	f.Duration(&o.failureWindow, "topic-failure-window", breaker.FailureWindowDefault, "how far back failed batches count toward --topic-failure-threshold")
}

// build validates the flags and returns the breaker, logging its state changes.
func (o *topicBreakerOptions) build(f *flags, logger *slog.Logger) (*breaker.Topics, error) {
	positive := func(v int, name string) error {
		if v < 1 {
			return usagef("%s is %d: it must be at least 1", f.origin(name), v)
		}
		return nil
	}
	for _, c := range []struct {
		v    int
		name string
	}{{o.cooldownMaxTicks, "topic-cooldown-max-ticks"}, {o.cooldownTicks, "topic-cooldown-ticks"}, {o.failureThreshold, "topic-failure-threshold"}} {
		if err := positive(c.v, c.name); err != nil {
			return nil, err
		}
	}
	if o.cooldownTicks > o.cooldownMaxTicks {
		return nil, usagef("%s %d is more than %s %d", f.origin("topic-cooldown-ticks"), o.cooldownTicks, f.origin("topic-cooldown-max-ticks"), o.cooldownMaxTicks)
	}
	if o.failureWindow < time.Millisecond {
		return nil, usagef("%s is %s: it must be at least 1ms", f.origin("topic-failure-window"), o.failureWindow)
	}
	cooldowns := map[string]int{}
	if strings.TrimSpace(o.cooldown) != "" {
		for _, pair := range strings.Split(o.cooldown, ",") {
			topic, ticks, ok := strings.Cut(strings.TrimSpace(pair), "=")
			n, err := strconv.Atoi(strings.TrimSpace(ticks))
			if !ok || strings.TrimSpace(topic) == "" || err != nil || n < 1 || n > o.cooldownMaxTicks {
				return nil, usagef("invalid entry %q in %s %q: write topic=ticks with 1 ≤ ticks ≤ %d, entries separated by commas (e.g. orders=30,payments=5)",
					pair, f.origin("topic-cooldown"), o.cooldown, o.cooldownMaxTicks)
			}
			cooldowns[strings.TrimSpace(topic)] = n
		}
	}
	return breaker.New(breaker.Settings{
		Cooldowns:        cooldowns,
		CooldownTicks:    o.cooldownTicks,
		FailureThreshold: o.failureThreshold,
		FailureWindow:    o.failureWindow,
		MaxCooldownTicks: o.cooldownMaxTicks,
		OnStateChange:    outbox.LogTopicStateChange(logger),
	}), nil
}
