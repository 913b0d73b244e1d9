package breaker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults for [RedisConfig].
const (
	LeaseDefault      = 10 * time.Second
	TrialTTLDefault   = 30 * time.Second
	OpTimeoutDefault  = 500 * time.Millisecond
	RetryEveryDefault = time.Second
)

// RedisConfig configures a [Redis] breaker.
type RedisConfig struct {
	// Client is the Redis client. Required.
	Client *redis.Client
	// Prefix starts every key; give each outbox its own. Required.
	Prefix string
	// Instance names this sweeper among those sharing the state. Defaults to
	// hostname-pid-nanotime.
	Instance string
	// Settings are the breaker's thresholds and cooldowns, the same for every
	// instance. OnStateChange is called for the changes this instance makes.
	Settings Settings
	// Lease is how long the instance that counts ticks keeps that role without
	// ticking again; when it stops, another takes over after this. Defaults to
	// LeaseDefault; make it a few ticks long.
	Lease time.Duration
	// TrialTTL is how long a half-open topic's trial belongs to the instance that
	// took it; an unreported trial is handed out again after it. Defaults to
	// TrialTTLDefault; make it longer than a send.
	TrialTTL time.Duration
	// OpTimeout bounds each Redis call. Defaults to OpTimeoutDefault.
	OpTimeout time.Duration
	// RetryEvery is how often a breaker working on local state tries Redis
	// again at a plan or TryAgain (a tick always tries). Defaults to
	// RetryEveryDefault.
	RetryEvery time.Duration
	// OnRedisError is called once when Redis stops answering (the breaker then
	// works on local state) and once with nil when it answers again.
	OnRedisError func(err error)
}

// Redis is the per-topic breaker with its state in Redis, shared by every
// sweeper instance on one outbox:
//
//   - A trip by any instance is seen by every instance at its next plan.
//   - Failures from all instances count toward the threshold together.
//   - Cooldowns are counted in ticks by one instance at a time, the holder of a
//     lease that it renews at every tick. Ticks are per instance, so letting all
//     instances count would make a cooldown N times shorter; a wall-clock
//     deadline would stop cooldowns following the schedule. When the holder stops,
//     another instance takes the lease after Lease.
//   - A half-open topic's trial goes to the first instance that claims it (a key
//     with TTL); the others keep leaving the topic out.
//
// Topics are bytes, not text: a SQL_ASCII outbox holds topics that are not
// UTF-8, and an instance over it trips them like any other. Redis keeps them
// byte for byte (hash fields and key names are binary-safe), and the breaker
// hands them on as it read them, to the plan, Tripped and OnStateChange, so that
// the plan leaves out exactly the rows that failed. Consumers that need text
// make it themselves: the metrics escape label values, JSON replaces bad bytes.
//
// Every multi-key update runs as one Lua script, so instances never see half an
// update. If Redis does not answer, the breaker works on local state: a [Topics]
// that has received the same reports all along. It tries Redis again at every
// tick, and at a plan or TryAgain once RetryEvery has passed, and when it
// answers, copies the topics tripped locally meanwhile to Redis.
// Redis never becomes a reason to stop relaying.
type Redis struct {
	cfg    RedisConfig
	local  *Topics
	notify func(topic string, from, to State, reason string)

	mu       sync.Mutex
	degraded bool
	// tried is when Redis was last tried while degraded (TryAgain).
	tried time.Time
	// planLocal says the last plan came from the local shadow, so its
	// generations are the shadow's.
	planLocal bool
	trials    map[string]bool // the trials of this instance's last plan
	// turn is the last topic this instance claimed a trial of when more
	// were half-open than MaxTrials: the next plan starts after it.
	turn string
	// pending holds what happened on local state while Redis did not answer,
	// to copy when it does: topics tripped (true) and reset (false).
	pending map[string]bool
	// shared counts what the shared state tripped through this instance,
	// once Redis holds it: its failures' trips (which the local shadow may
	// not make) and an operator's (Trips).
	shared atomic.Uint64
}

var _ Breaker = (*Redis)(nil)

// NewRedis returns a breaker sharing its state through cfg.Client.
func NewRedis(cfg RedisConfig) (*Redis, error) {
	if cfg.Client == nil {
		return nil, errors.New("breaker: RedisConfig.Client is required")
	}
	if cfg.Prefix == "" {
		return nil, errors.New("breaker: RedisConfig.Prefix is required")
	}
	if cfg.Instance == "" {
		host, _ := os.Hostname()
		cfg.Instance = fmt.Sprintf("%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
	}
	if cfg.Lease <= 0 {
		cfg.Lease = LeaseDefault
	}
	if cfg.TrialTTL <= 0 {
		cfg.TrialTTL = TrialTTLDefault
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = OpTimeoutDefault
	}
	if cfg.RetryEvery <= 0 {
		cfg.RetryEvery = RetryEveryDefault
	}
	notify := cfg.Settings.OnStateChange
	local := cfg.Settings
	local.OnStateChange = nil // the shared state's changes are the ones to tell
	r := &Redis{cfg: cfg, local: New(local), notify: notify, pending: map[string]bool{}}
	r.cfg.Settings = r.local.s // defaults filled in
	return r, nil
}

func (r *Redis) key(parts ...string) string {
	k := r.cfg.Prefix
	for _, p := range parts {
		k += ":" + p
	}
	return k
}

// keys are the script's KEYS: the topics hash, the generations hash, the tick
// lease. Per-topic keys (failures, trial) are built in the scripts from the
// prefix, so the breaker needs one Redis, not a cluster.
func (r *Redis) keys() []string {
	return []string{r.key("topics"), r.key("gens"), r.key("lease")}
}

func (r *Redis) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), r.cfg.OpTimeout)
}

func (r *Redis) isDegraded() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.degraded
}

// fail records that Redis did not answer and switches to local state, telling
// OnRedisError once.
func (r *Redis) fail(err error) {
	r.mu.Lock()
	first := !r.degraded
	r.degraded = true
	r.tried = time.Now()
	r.mu.Unlock()
	if first && r.cfg.OnRedisError != nil {
		r.cfg.OnRedisError(err)
	}
}

// TryAgain tries Redis again, if the breaker works on local state and
// RetryEvery has passed since the last try, and copies there what changed
// locally meanwhile; it reports whether it tried. A plan calls it first (a
// tick tries at every tick); so does a relay of many outboxes, every second,
// for each outbox: one it has parked neither ticks nor plans, and a topic an
// operator tripped through it during an outage would stay in this process
// alone, while the other instances, on Redis, sent the topic's next rows;
// its first plan after Redis came back would come from the local copy, blind
// to what they had tripped since. The pace bounds what a hung Redis costs a sweep's plan:
// a call's timeout every RetryEvery. Not in a goroutine of its own: the
// breaker has no end to stop one at.
func (r *Redis) TryAgain() bool {
	tried, _ := r.try(false)
	return tried
}

// try tries Redis again while the breaker works on local state, when
// RetryEvery has passed since the last try or always, and says whether it
// tried and, if so, whether Redis answered.
func (r *Redis) try(always bool) (tried bool, err error) {
	r.mu.Lock()
	due := r.degraded && (always || time.Since(r.tried) >= r.cfg.RetryEvery)
	if due {
		r.tried = time.Now()
	}
	r.mu.Unlock()
	if !due {
		return false, nil
	}
	ctx, cancel := r.ctx()
	defer cancel()
	return true, r.reconcile(ctx) // a failure keeps the local state, until the next try
}

// remote is a topic as the shared state holds it.
type remote struct {
	State     string `json:"state"`
	TicksLeft int    `json:"ticks_left"`
	Cooldown  int    `json:"cooldown"`
	Trips     int    `json:"trips"`
	TrippedAt int64  `json:"tripped_at"` // Unix ms
	LastError string `json:"last_error"`
}

// The scripts share these helpers. Topic state is JSON in the topics hash;
// generations live in their own hash. A close deletes the topic's generation,
// so that the hash, which every plan reads, holds the topics that are not
// closed and no more: rows that each carry a topic of their own would
// otherwise grow it, and every plan, by one entry per topic ever tripped. A
// close notes instead when it came, in the sequence, in a key of the topic's
// own that lives an hour; a plan carries the sequence it read as every
// closed topic's generation, so a report of a batch planned before the close
// (an operator's trip and reset in between) is told stale (current), where
// both once read as generation 0. The
// other generations come from one sequence (bump), so that a topic tripped
// again never gets back a generation it had: a report from a batch planned
// while the topic was tripped or half-open is ignored whatever happened since.
const luaHelpers = `
local topics, gens, lease = KEYS[1], KEYS[2], KEYS[3]
local prefix = ARGV[1]
local function bump(topic)
  redis.call('HSET', gens, topic, redis.call('INCR', prefix .. ':genseq'))
  redis.call('PERSIST', prefix .. ':genseq') -- kept for good while in use (Forget)
end
local function trip(topic, st, cooldown, now, err)
  cooldown = math.max(1, cooldown)
  st = st or {trips = 0}
  st.state, st.ticks_left, st.cooldown = 'tripped', cooldown, cooldown
  st.trips = (st.trips or 0) + 1
  st.tripped_at, st.last_error = now, err
  redis.call('HSET', topics, topic, cjson.encode(st))
  bump(topic)
  redis.call('DEL', prefix .. ':failures:' .. topic, prefix .. ':trial:' .. topic)
  return 'tripped'
end
-- mark_closed notes when topic closed (or was reset closed), in the
-- sequence of generations: a failure of a batch planned before (its plan read
-- a lower sequence) is stale. Kept for an hour, past any batch in flight.
local function mark_closed(topic)
  redis.call('SET', prefix .. ':closed:' .. topic, redis.call('INCR', prefix .. ':genseq'), 'PX', 3600000)
  redis.call('PERSIST', prefix .. ':genseq')
end
local function close(topic)
  redis.call('HDEL', topics, topic)
  redis.call('HDEL', gens, topic)
  redis.call('DEL', prefix .. ':failures:' .. topic, prefix .. ':trial:' .. topic)
  mark_closed(topic)
  return 'closed'
end
-- current says whether gen, a report's, is topic's generation now: its own
-- while tripped or half-open; while closed, any plan's sequence since the
-- close (a plan read before it is stale).
local function current(topic, gen)
  local g = redis.call('HGET', gens, topic)
  if g then return tonumber(g) == gen end
  local closed = redis.call('GET', prefix .. ':closed:' .. topic)
  return not closed or tonumber(closed) <= gen
end
`

// ARGV: prefix, topic, gen, topicClass (0/1), now ms, window ms, threshold,
// cooldown, max cooldown, error text, member.
var failureScript = redis.NewScript(luaHelpers + `
local topic, gen = ARGV[2], tonumber(ARGV[3])
if not current(topic, gen) then return '' end
local raw = redis.call('HGET', topics, topic)
local st = raw and cjson.decode(raw)
local now, maxc = tonumber(ARGV[5]), tonumber(ARGV[9])
if st and st.state == 'tripped' then return '' end
if st and st.state == 'half-open' then
  trip(topic, st, math.min(2 * st.cooldown, maxc), now, ARGV[10])
  return 'retripped'
end
local f = prefix .. ':failures:' .. topic
redis.call('ZADD', f, now, ARGV[11])
redis.call('ZREMRANGEBYSCORE', f, '-inf', now - tonumber(ARGV[6]))
redis.call('PEXPIRE', f, ARGV[6])
if ARGV[4] == '1' or redis.call('ZCARD', f) >= tonumber(ARGV[7]) then
  return trip(topic, st, math.min(tonumber(ARGV[8]), maxc), now, ARGV[10])
end
return ''
`)

// ARGV: prefix, topic, gen.
var successScript = redis.NewScript(luaHelpers + `
local topic = ARGV[2]
if tonumber(redis.call('HGET', gens, topic) or '0') ~= tonumber(ARGV[3]) then return '' end
local raw = redis.call('HGET', topics, topic)
if raw and cjson.decode(raw).state == 'half-open' then return close(topic) end
return ''
`)

// ARGV: prefix, instance, lease ms. Only the lease holder (or the first to take a
// free lease) counts the tick. Returns the topics that became half-open.
var tickScript = redis.NewScript(luaHelpers + `
local holder = redis.call('GET', lease)
if holder and holder ~= ARGV[2] then return {} end
redis.call('SET', lease, ARGV[2], 'PX', ARGV[3])
local opened = {}
local all = redis.call('HGETALL', topics)
for i = 1, #all, 2 do
  local st = cjson.decode(all[i + 1])
  if st.state == 'tripped' then
    -- Check, then count, as the in-memory breaker does.
    if st.ticks_left <= 0 then
      st.ticks_left, st.state = 0, 'half-open'
      bump(all[i])
      redis.call('DEL', prefix .. ':trial:' .. all[i])
      table.insert(opened, all[i])
    else
      st.ticks_left = st.ticks_left - 1
    end
    redis.call('HSET', topics, all[i], cjson.encode(st))
  end
end
return opened
`)

// ARGV: prefix, topic, cooldown, now ms, reason. Trips whatever the state, and
// returns the state it was in.
var tripScript = redis.NewScript(luaHelpers + `
local raw = redis.call('HGET', topics, ARGV[2])
local st = raw and cjson.decode(raw)
local from = st and st.state or 'closed'
trip(ARGV[2], st, tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5])
return from
`)

// ARGV: prefix, topic, cooldown, ticks left, trips, tripped at ms, last error.
// Copies a trip made on local state while Redis did not answer, unless Redis
// has the topic tripped already.
var copyTripScript = redis.NewScript(luaHelpers + `
if redis.call('HEXISTS', topics, ARGV[2]) == 1 then return '' end
local cooldown = math.max(1, tonumber(ARGV[3]))
redis.call('HSET', topics, ARGV[2], cjson.encode({state = 'tripped', cooldown = cooldown,
  ticks_left = tonumber(ARGV[4]), trips = tonumber(ARGV[5]), tripped_at = tonumber(ARGV[6]),
  last_error = ARGV[7]}))
bump(ARGV[2])
return 'tripped'
`)

// ARGV: prefix, topic. Returns the state the topic was in, ” if closed.
var resetScript = redis.NewScript(luaHelpers + `
local raw = redis.call('HGET', topics, ARGV[2])
if raw then
  close(ARGV[2])
  return cjson.decode(raw).state
end
-- Closed already: its failures go, and those of batches planned before the
-- reset must not count after it (as in memory a generation).
redis.call('DEL', prefix .. ':failures:' .. ARGV[2])
mark_closed(ARGV[2])
return ''
`)

// OnTick advances the local shadow, and the shared cooldowns if this instance
// holds the tick lease. While degraded it first tries Redis again, and on an
// answer copies the local trips to Redis.
func (r *Redis) OnTick() {
	r.local.OnTick()
	// At every tick, not at TryAgain's pace: the local shadow counts the
	// cooldowns down meanwhile, and a trip that ran out there before Redis
	// was tried again would never be copied.
	if _, err := r.try(true); err != nil {
		return
	}
	ctx, cancel := r.ctx()
	defer cancel()
	opened, err := tickScript.Run(ctx, r.cfg.Client, r.keys(), r.cfg.Prefix, r.cfg.Instance, r.cfg.Lease.Milliseconds()).StringSlice()
	if err != nil {
		r.fail(fmt.Errorf("topic breaker tick: %w", err))
		return
	}
	for _, t := range opened {
		r.tell(t, StateTripped, StateHalfOpen, "cooldown over")
	}
}

// reconcile runs when Redis answers again after an outage: what this instance
// did on local state meanwhile is copied there. Topics it tripped are tripped in
// Redis (unless another instance tripped them already), with their cooldown and
// trips; topics an operator reset are reset. Nothing else of the shadow is
// copied: it may be stale.
func (r *Redis) reconcile(ctx context.Context) error {
	if err := r.cfg.Client.Ping(ctx).Err(); err != nil {
		return err
	}
	r.mu.Lock()
	pending := maps.Clone(r.pending)
	r.mu.Unlock()
	for topic, tripped := range pending {
		var err error
		if !tripped {
			err = resetScript.Run(ctx, r.cfg.Client, r.keys(), r.cfg.Prefix, topic).Err()
		} else if st, cooldown, ok := r.local.status(topic); ok && st.State == StateTripped.String() {
			err = copyTripScript.Run(ctx, r.cfg.Client, r.keys(), r.cfg.Prefix, topic, cooldown, st.CooldownTicksLeft,
				st.Trips, st.TrippedAt.UnixMilli(), st.LastError).Err()
		}
		if err != nil {
			return err
		}
	}
	r.mu.Lock()
	// A trip or reset made while this ran is still local only: it stays
	// pending, and the instance stays degraded until a later try copies
	// it.
	for topic, tripped := range pending {
		if now, ok := r.pending[topic]; ok && now == tripped {
			delete(r.pending, topic)
		}
	}
	// A tick and a plan may both get here: the one that ends the outage
	// tells of it.
	was := r.degraded
	r.degraded = len(r.pending) > 0
	back := was && !r.degraded
	r.mu.Unlock()
	if !back {
		return nil
	}
	if r.cfg.OnRedisError != nil {
		r.cfg.OnRedisError(nil)
	}
	return nil
}

// load reads every non-closed topic, every generation, and the sequence of
// generations (the closed topics' generation in a plan).
func (r *Redis) load(ctx context.Context) (map[string]remote, map[string]uint64, uint64, error) {
	// One transaction: a topic read closed in one hash and half-open in the
	// other would send an ordinary batch under its trial's generation.
	pipe := r.cfg.Client.TxPipeline()
	topicsCmd := pipe.HGetAll(ctx, r.key("topics"))
	gensCmd := pipe.HGetAll(ctx, r.key("gens"))
	seqCmd := pipe.Get(ctx, r.key("genseq"))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, 0, err
	}
	seq, _ := strconv.ParseUint(seqCmd.Val(), 10, 64) // none yet: 0
	topics := make(map[string]remote, len(topicsCmd.Val()))
	for t, raw := range topicsCmd.Val() {
		var st remote
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			return nil, nil, 0, fmt.Errorf("topic %q in %s: %w", t, r.key("topics"), err)
		}
		topics[t] = st
	}
	gens := make(map[string]uint64, len(gensCmd.Val()))
	for t, v := range gensCmd.Val() {
		n, _ := strconv.ParseUint(v, 10, 64)
		gens[t] = n
	}
	return topics, gens, seq, nil
}

// Plan reads the shared state: tripped topics are left out, and each half-open
// topic is tried by the one instance that claims its trial; the others leave it
// out too. At most MaxTrials half-open topics are claimed a plan, taken in
// turn as the in-memory breaker takes them (the turn is this instance's), in
// one round trip: a flood's topics come out of their cooldown together, and a
// claim each would cost a round trip each.
func (r *Redis) Plan() Plan {
	if r.TryAgain(); r.isDegraded() {
		return r.localPlan()
	}
	ctx, cancel := r.ctx()
	defer cancel()
	topics, gens, seq, err := r.load(ctx)
	if err != nil {
		r.fail(fmt.Errorf("topic breaker plan: %w", err))
		return r.localPlan()
	}
	p := Plan{Excluded: make([]string, 0, len(topics)), Trials: map[string]bool{}, gens: gens, closed: seq}
	var waiting []string
	for t, st := range topics {
		if st.State != StateHalfOpen.String() {
			p.Excluded = append(p.Excluded, t)
			continue
		}
		waiting = append(waiting, t)
	}
	r.mu.Lock()
	tried, later := takeTurns(waiting, &r.turn, r.cfg.Settings.MaxTrials)
	r.mu.Unlock()
	p.Excluded = append(p.Excluded, later...)
	won, err := r.claimTrials(ctx, tried)
	if err != nil {
		r.fail(fmt.Errorf("topic breaker trials of %d topics: %w", len(tried), err))
		return r.localPlan()
	}
	for _, t := range tried {
		if won[t] {
			p.Trials[t] = true
		} else {
			p.Excluded = append(p.Excluded, t)
		}
	}
	r.mu.Lock()
	r.trials = maps.Clone(p.Trials)
	r.planLocal = false
	keep := maps.Clone(r.pending)
	r.mu.Unlock()
	r.local.mirror(topics, keep)
	return p
}

// claimTrials claims the trials of topics for this instance, in one pipeline:
// a topic's trial is this instance's if it set the trial key, or if the key
// already names it (a trial it took earlier and has not reported).
func (r *Redis) claimTrials(ctx context.Context, topics []string) (map[string]bool, error) {
	won := make(map[string]bool, len(topics))
	if len(topics) == 0 {
		return won, nil
	}
	pipe := r.cfg.Client.Pipeline()
	set := make([]*redis.BoolCmd, len(topics))
	holder := make([]*redis.StringCmd, len(topics))
	for i, t := range topics {
		set[i] = pipe.SetNX(ctx, r.key("trial", t), r.cfg.Instance, r.cfg.TrialTTL)
		holder[i] = pipe.Get(ctx, r.key("trial", t))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	for i, t := range topics {
		won[t] = set[i].Val() || holder[i].Val() == r.cfg.Instance
	}
	return won, nil
}

// localPlan is the plan of the local shadow, used while Redis does not answer.
func (r *Redis) localPlan() Plan {
	p := r.local.Plan()
	r.mu.Lock()
	r.trials = maps.Clone(p.Trials)
	r.planLocal = true
	r.mu.Unlock()
	return p
}

// Success reports an accepted batch. Only a trial's success changes the shared
// state, so other batches cost no Redis call.
func (r *Redis) Success(topic string, gen uint64) {
	r.closeHalfOpen(topic, gen, "trial batch succeeded")
}

// Empty closes a half-open topic that has no row left to try, in the shared
// state too when this instance holds its trial.
func (r *Redis) Empty(topic string, gen uint64) { r.closeHalfOpen(topic, gen, "no rows left to try") }

func (r *Redis) closeHalfOpen(topic string, gen uint64, reason string) {
	r.local.closeHalfOpen(topic, r.localGen(topic, gen), reason)
	r.mu.Lock()
	trial, planLocal := r.trials[topic], r.planLocal
	r.mu.Unlock()
	if !trial || planLocal || r.isDegraded() {
		return
	}
	ctx, cancel := r.ctx()
	defer cancel()
	res, err := successScript.Run(ctx, r.cfg.Client, r.keys(), r.cfg.Prefix, topic, gen).Text()
	if err != nil {
		r.fail(fmt.Errorf("topic breaker success of %q: %w", topic, err))
		return
	}
	if res == "closed" {
		r.tell(topic, StateHalfOpen, StateClosed, reason)
	}
}

// Failure reports a failed batch to Redis (and to the local shadow).
func (r *Redis) Failure(topic string, gen uint64, topicClass bool, errText string) {
	r.local.Failure(topic, r.localGen(topic, gen), topicClass, errText)
	r.mu.Lock()
	planLocal := r.planLocal
	r.mu.Unlock()
	if planLocal || r.isDegraded() {
		r.remember(topic)
		return
	}
	ctx, cancel := r.ctx()
	defer cancel()
	s := r.cfg.Settings
	class := "0"
	if topicClass {
		class = "1"
	}
	now := s.Now()
	res, err := failureScript.Run(ctx, r.cfg.Client, r.keys(), r.cfg.Prefix, topic, gen, class, now.UnixMilli(),
		s.FailureWindow.Milliseconds(), s.FailureThreshold, r.local.cooldownOf(topic), s.MaxCooldownTicks, errText,
		fmt.Sprintf("%s-%d", r.cfg.Instance, now.UnixNano())).Text()
	if err != nil {
		r.fail(fmt.Errorf("topic breaker failure of %q: %w", topic, err))
		r.remember(topic)
		return
	}
	switch res {
	case "tripped":
		r.shared.Add(1)
		r.tell(topic, StateClosed, StateTripped, "failure reported by "+r.cfg.Instance)
	case "retripped":
		r.shared.Add(1)
		r.tell(topic, StateHalfOpen, StateTripped, "trial batch failed")
	}
}

// remember notes a local trip of topic, made while Redis did not answer, for
// reconcile to copy.
//
// A trip noted while the breaker is not degraded (a sweep planned from the
// shadow during an outage, reporting after Redis came back) makes it so
// again, due at once: reconcile copies only while degraded, and the trip,
// kept from every mirror by pending, would never have reached Redis (an
// independent review, 2026-11-29).
func (r *Redis) remember(topic string) {
	if st, _, ok := r.local.status(topic); ok && st.State == StateTripped.String() {
		r.mu.Lock()
		r.pending[topic] = true
		if !r.degraded {
			r.degraded, r.tried = true, time.Time{}
		}
		r.mu.Unlock()
	}
}

// Trip trips topic in the shared state (and locally).
func (r *Redis) Trip(topic, reason string) {
	r.local.Trip(topic, reason)
	if r.isDegraded() {
		r.remember(topic)
		return
	}
	ctx, cancel := r.ctx()
	defer cancel()
	from, err := tripScript.Run(ctx, r.cfg.Client, r.keys(), r.cfg.Prefix, topic, r.local.cooldownOf(topic),
		r.cfg.Settings.Now().UnixMilli(), reason).Text()
	if err != nil {
		r.fail(fmt.Errorf("topic breaker trip of %q: %w", topic, err))
		r.remember(topic)
		return
	}
	// Moved again once Redis holds the trip: a sweep that read the list
	// between the local trip and this write, and did not find it there,
	// reads it again.
	r.shared.Add(1)
	r.tell(topic, parseState(from), StateTripped, trippedByOperator+": "+reason)
}

// Reset closes topic in the shared state (and locally).
func (r *Redis) Reset(topic string) {
	r.local.Reset(topic)
	if r.isDegraded() {
		r.mu.Lock()
		r.pending[topic] = false
		r.mu.Unlock()
		return
	}
	ctx, cancel := r.ctx()
	defer cancel()
	res, err := resetScript.Run(ctx, r.cfg.Client, r.keys(), r.cfg.Prefix, topic).Text()
	if err != nil {
		r.fail(fmt.Errorf("topic breaker reset of %q: %w", topic, err))
		r.mu.Lock()
		r.pending[topic] = false // reset it in Redis when it answers
		r.mu.Unlock()
		return
	}
	if res != "" {
		r.tell(topic, parseState(res), StateClosed, resetByOperator)
	}
}

// forgetScript deletes an outbox's shared state, and lets its generations'
// sequence expire after ARGV[2] ms unless a trip uses it again (bump).
// KEYS: topics, gens, lease; ARGV: prefix, the sequence's time to live.
var forgetScript = redis.NewScript(`
local topics, gens, lease = KEYS[1], KEYS[2], KEYS[3]
local prefix = ARGV[1]
for _, h in ipairs({topics, gens}) do
  for _, t in ipairs(redis.call('HKEYS', h)) do
    redis.call('DEL', prefix .. ':failures:' .. t, prefix .. ':trial:' .. t)
  end
end
redis.call('PEXPIRE', prefix .. ':genseq', ARGV[2])
return redis.call('DEL', topics, gens, lease)
`)

// forgottenSequence is how long the generations' sequence of an outbox
// forgotten outlives it: long past any instance's last report of a batch
// of the old table (its listing's interval and a send's timeout), short
// enough that a thousand tenants dropped over a year leave no key behind.
const forgottenSequence = 24 * time.Hour

// Forget deletes the outbox's shared state from Redis: its tripped and
// half-open topics, their generations and trials, the tick lease. It is for
// an outbox gone for good (its table dropped): a table made again under the
// same name would otherwise start with the old one's trips, and every
// instance's plans would leave its topics out until an operator reset them.
// Failures counted toward a trip that did not happen expire on their own
// within the failure window. The generations' sequence is kept for a day
// (for good if a trip uses it again): a report of a batch of the old
// table, from an instance yet to let it go, never matches a generation of
// the new one's.
func (r *Redis) Forget(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	if err := forgetScript.Run(ctx, r.cfg.Client, r.keys(), r.cfg.Prefix, forgottenSequence.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("forget the topic breaker's state under %q in Redis: %w", r.cfg.Prefix, err)
	}
	return nil
}

// Trips counts the trips made through this instance (TripCounter): an
// operator's, and those its failures made, in the shared state or in its local
// shadow. A trip made by another instance is seen at this one's next plan.
func (r *Redis) Trips() uint64 { return r.local.Trips() + r.shared.Load() }

// Tripped lists the shared state's topics that are not closed, or the local
// ones while Redis does not answer.
func (r *Redis) Tripped() []TopicStatus {
	// No TryAgain: the metrics and the admin API list every outbox's
	// breaker, and against a hung Redis a try each would cost them a call's
	// timeout per outbox. A relay of many has its parked outboxes' breakers
	// try (TryAgain), one a pass while Redis does not answer.
	if r.isDegraded() {
		return r.local.Tripped()
	}
	ctx, cancel := r.ctx()
	defer cancel()
	topics, _, _, err := r.load(ctx)
	if err != nil {
		r.fail(fmt.Errorf("topic breaker list: %w", err))
		return r.local.Tripped()
	}
	var out []TopicStatus
	for _, t := range slices.Sorted(maps.Keys(topics)) {
		st := topics[t]
		out = append(out, TopicStatus{Topic: t, State: st.State, CooldownTicksLeft: st.TicksLeft, Trips: st.Trips,
			TrippedAt: time.UnixMilli(st.TrippedAt).UTC(), LastError: st.LastError})
	}
	return out
}

// State returns topic's shared state, or its local one while Redis does not
// answer.
func (r *Redis) State(topic string) State {
	for _, st := range r.Tripped() {
		if st.Topic == topic {
			return parseState(st.State)
		}
	}
	return StateClosed
}

// parseState reads a state as Redis holds it, the names State.String gives.
func parseState(s string) State {
	switch s {
	case StateTripped.String():
		return StateTripped
	case StateHalfOpen.String():
		return StateHalfOpen
	default:
		return StateClosed
	}
}

// localGen returns the generation to report to the local shadow: gen itself
// when the plan was local, else the shadow's current one (the plan came from
// Redis, whose generations are not the shadow's).
func (r *Redis) localGen(topic string, gen uint64) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.planLocal {
		return gen
	}
	return r.local.genOf(topic)
}

// Degraded reports whether the breaker is working on local state because Redis
// did not answer.
func (r *Redis) Degraded() bool { return r.isDegraded() }

func (r *Redis) tell(topic string, from, to State, reason string) {
	if r.notify != nil {
		r.notify(topic, from, to, reason)
	}
}
