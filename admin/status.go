package admin

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/outbox-sweeper/sweeper/breaker"
	"github.com/outbox-sweeper/sweeper/outbox"
)

// DegradedSweepFailures is how many sweeps in a row must fail for GET /status
// to say degraded: one failure is a blip the backoff rides out (a statement
// cancelled, a connection reset); three in a row, seconds apart, are a fault.
const DegradedSweepFailures = 3

// DegradedDeadLettersDefault is the dead letters above which GET /status says
// degraded: seed 003's health check's threshold.
const DegradedDeadLettersDefault = 100

// StatusCacheForDefault is how long GET /status answers from the backlog it
// read last. At 1,000 topics and a 1,000,000-row backlog the read takes a quarter
// of a second (BENCHMARKS.md): cached, a page refreshing every few seconds
// costs the database at most that every few seconds, however many pages are
// open.
const StatusCacheForDefault = 5 * time.Second

// readBacklog returns the backlog by topic and the dead letters by group, and
// when they were read: from the cache when it is fresh.
func (a *api) readBacklog(ctx context.Context) ([]outbox.TopicBacklog, []outbox.DeadLetterGroup, time.Time, error) {
	if err := a.cacheMu.lock(ctx); err != nil {
		return nil, nil, time.Time{}, err
	}
	defer a.cacheMu.unlock() // one read at a time: the others wait for it, then share it
	if !a.cachedAt.IsZero() && time.Since(a.cachedAt) < a.cfg.StatusCacheFor {
		return a.cachedTops, a.cachedDead, a.cachedAt, nil
	}
	at := time.Now()
	tops, err := a.backlog.Topics(ctx)
	if err != nil {
		return nil, nil, at, err
	}
	dead, err := a.backlog.DeadLetters(ctx)
	if err != nil {
		return nil, nil, at, err
	}
	a.cachedAt, a.cachedTops, a.cachedDead = at, tops, dead
	return tops, dead, at, nil
}

// topicStatus is one topic as GET /status shows it: what waits of it, what
// the topic breaker and the topic backoff say of it, and the gate's answer,
// which weighs them (and the sweep in progress) into one.
type topicStatus struct {
	Topic            string  `json:"topic"`
	Outstanding      int64   `json:"outstanding"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	// State is the topic breaker's: closed, tripped or half-open.
	State             string     `json:"state"`
	CooldownTicksLeft int        `json:"cooldown_ticks_left,omitempty"`
	Trips             int        `json:"trips,omitempty"`
	TrippedAt         *time.Time `json:"tripped_at,omitempty"`
	LastError         string     `json:"last_error,omitempty"`
	// BackoffSeconds is how long the topic still waits after transient
	// failures in a row; BackoffFailures, how many.
	BackoffSeconds  float64 `json:"backoff_seconds,omitempty"`
	BackoffFailures int     `json:"backoff_failures,omitempty"`
	// What this process did for the topic within the last minute (see
	// outbox.TopicActivity): counted as it happens, not read from the table.
	DispatchedLastMinute    int `json:"dispatched_last_minute"`
	FailedBatchesLastMinute int `json:"failed_batches_last_minute"`
	DeadLetteredLastMinute  int `json:"dead_lettered_last_minute"`
	// Gate is why the topic does not send now, and until when (Config.Gate);
	// nil when nothing of the topic's own holds it.
	Gate *outbox.TopicGate `json:"gate,omitempty"`
}

// status is everything an operator looks at first, in one answer: each topic
// with outstanding rows, a breaker that is not closed, a backoff or activity
// in the last minute, the broker breaker,
// and the dead letters by topic and reason; and what holds a topic, as the
// gate answers it. The topics' figures come from one
// query of the index of outstanding rows (its cost is in BENCHMARKS.md), at
// most StatusCacheFor old (backlog_read_at says when); the breakers' from
// memory, current.
func (a *api) status(w http.ResponseWriter, r *http.Request) {
	if a.backlogErr != nil {
		a.internal(w, r, a.backlogErr)
		return
	}
	backlog, dead, readAt, err := a.readBacklog(r.Context())
	if err != nil {
		a.internal(w, r, err)
		return
	}
	byTopic := map[string]*topicStatus{}
	topics := make([]*topicStatus, 0, len(backlog))
	get := func(topic string) *topicStatus {
		t, ok := byTopic[topic]
		if !ok {
			t = &topicStatus{Topic: topic, State: "closed"}
			byTopic[topic] = t
			topics = append(topics, t)
		}
		return t
	}
	for _, b := range backlog {
		t := get(b.Topic)
		t.Outstanding, t.OldestAgeSeconds = b.Outstanding, b.OldestAgeSeconds
	}
	for _, tr := range a.cfg.Topics.Tripped() {
		t := get(tr.Topic)
		t.State, t.CooldownTicksLeft, t.Trips, t.LastError = tr.State, tr.CooldownTicksLeft, tr.Trips, tr.LastError
		at := tr.TrippedAt
		t.TrippedAt = &at
	}
	// One now for the backoffs and the gate, so that the two agree on
	// whether a backoff has ended.
	now := time.Now()
	if a.cfg.Backoffs != nil {
		for _, b := range a.cfg.Backoffs() {
			t := get(b.Topic)
			t.BackoffSeconds, t.BackoffFailures = max(b.Until.Sub(now), 0).Seconds(), b.Failures
		}
	}
	if a.cfg.Gate != nil {
		for _, g := range a.cfg.Gate.Gates(now) {
			get(g.Topic).Gate = &g
		}
	}
	if a.cfg.Activity != nil {
		for _, act := range a.cfg.Activity() {
			t := get(act.Topic)
			t.DispatchedLastMinute, t.FailedBatchesLastMinute, t.DeadLetteredLastMinute = act.Dispatched, act.FailedBatches, act.DeadLettered
		}
	}
	slices.SortFunc(topics, func(x, y *topicStatus) int { return strings.Compare(x.Topic, y.Topic) })
	var total int64
	for _, g := range dead {
		total += g.Count
	}
	if dead == nil {
		dead = []outbox.DeadLetterGroup{}
	}
	broker := map[string]any{"state": "none"}
	if a.cfg.Dependency != nil {
		broker = a.brokerBreaker()
	}
	if a.cfg.Gate != nil {
		if r := a.cfg.Gate.BrokerGate(); r != "" {
			broker["gate"] = r
		}
	}
	// The table's health is read with the backlog's answer but not cached
	// with it: it is one cheap query of the catalog and the statistics.
	table, err := a.backlog.Table(r.Context())
	if err != nil {
		a.internal(w, r, err)
		return
	}
	limit := cmp.Or(a.cfg.StatusTopics, StatusTopicsDefault)
	shown, omitted := capTopics(topics, limit)
	groups, groupsOmitted := capGroups(dead, limit)
	writeJSON(w, http.StatusOK, map[string]any{
		"health":          a.health(topics, total),
		"table":           table,
		"time":            time.Now().UTC(),
		"backlog_read_at": readAt.UTC(),
		"topics":          shown,
		"topics_omitted":  omitted,
		"broker_breaker":  broker,
		"dead_letters":    map[string]any{"total": total, "groups": groups, "groups_omitted": groupsOmitted},
	})
}

// healthStatus says whether the relay works as it should: ok, or degraded
// with its reasons. It is for the operator, not for Kubernetes: a tripped
// topic or an open broker breaker is the sweeper doing its job around a fault
// elsewhere, which neither a restart nor taking the pod out of service cures.
type healthStatus struct {
	Status  string   `json:"status"`
	Reasons []string `json:"reasons"`
}

func (a *api) health(topics []*topicStatus, deadLetters int64) healthStatus {
	h := healthStatus{Status: "ok", Reasons: []string{}}
	if d := a.cfg.Dependency; d != nil && d.State() != breaker.DependencyClosed {
		reason := "the broker circuit breaker is " + d.State().String() + ": nothing is sent but its trial batches"
		if by := d.Tripped(); by != "" {
			reason = "the broker circuit breaker was tripped by hand (" + by + "): nothing is sent until it is reset"
		}
		h.Reasons = append(h.Reasons, reason)
	}
	var stopped []string
	for _, t := range topics {
		if t.State != "closed" {
			stopped = append(stopped, t.Topic)
		}
	}
	if len(stopped) > 0 {
		names := stopped[:min(len(stopped), 5)]
		more := ""
		if len(stopped) > len(names) {
			more = fmt.Sprintf(" and %d more", len(stopped)-len(names))
		}
		quoted := make([]string, len(names))
		for i, n := range names {
			quoted[i] = quoteShort(n)
		}
		h.Reasons = append(h.Reasons, fmt.Sprintf("%d topics tripped or half-open: %s%s", len(stopped), strings.Join(quoted, ", "), more))
	}
	limit := a.cfg.DegradedDeadLetters
	if limit == 0 {
		limit = DegradedDeadLettersDefault
	}
	if limit > 0 && deadLetters > int64(limit) {
		h.Reasons = append(h.Reasons, fmt.Sprintf("%d dead letters, more than --degraded-dead-letters (%d)", deadLetters, limit))
	}
	if a.cfg.SweepsFailing != nil {
		if f, failing := a.cfg.SweepsFailing(); failing && f.Consecutive >= DegradedSweepFailures {
			h.Reasons = append(h.Reasons, fmt.Sprintf("%d sweeps in a row failed since %s, and nothing is sent meanwhile; the last: %s",
				f.Consecutive, f.Since.UTC().Format(time.RFC3339), f.Err))
		}
	}
	if len(h.Reasons) > 0 {
		h.Status = "degraded"
	}
	return h
}

// StatusTopicsDefault is how many topics GET /status lists when
// Config.StatusTopics is zero.
const StatusTopicsDefault = 200

// capTopics keeps the n topics an operator most needs to see, by name, and
// returns how many it left out. Rows that each carry a topic of their own
// (an application writing an id as the topic) made /status list every one:
// 20 MB at 100,000 topics, and a console that froze re-rendering them. What
// comes first: a breaker not closed, a backoff, failures or dead letters in
// the last minute, then the most outstanding rows, then the most dispatched.
func capTopics(topics []*topicStatus, n int) ([]*topicStatus, int) {
	if len(topics) <= n {
		return topics, 0
	}
	ranked := slices.Clone(topics)
	slices.SortFunc(ranked, func(x, y *topicStatus) int {
		return cmp.Or(
			-cmp.Compare(trouble(x), trouble(y)),
			-cmp.Compare(x.Outstanding, y.Outstanding),
			-cmp.Compare(x.DispatchedLastMinute, y.DispatchedLastMinute),
			strings.Compare(x.Topic, y.Topic))
	})
	shown := ranked[:n]
	slices.SortFunc(shown, func(x, y *topicStatus) int { return strings.Compare(x.Topic, y.Topic) })
	return shown, len(topics) - n
}

// trouble ranks what is wrong with a topic: higher comes first.
func trouble(t *topicStatus) int {
	switch {
	case t.State != "closed":
		return 3
	case t.BackoffFailures > 0:
		return 2
	case t.FailedBatchesLastMinute > 0 || t.DeadLetteredLastMinute > 0:
		return 1
	}
	return 0
}

// capGroups keeps the n dead-letter groups with the most rows, in their
// order, and returns how many it left out: the groups are by topic, so a
// topic per row makes one per row too.
func capGroups(groups []outbox.DeadLetterGroup, n int) ([]outbox.DeadLetterGroup, int) {
	if len(groups) <= n {
		return groups, 0
	}
	ranked := slices.Clone(groups)
	slices.SortStableFunc(ranked, func(x, y outbox.DeadLetterGroup) int { return -cmp.Compare(x.Count, y.Count) })
	floor := ranked[n-1].Count
	above := 0 // groups above floor are all kept; then groups at floor, first come
	for _, g := range ranked[:n] {
		if g.Count > floor {
			above++
		}
	}
	atFloor := n - above
	out := make([]outbox.DeadLetterGroup, 0, n)
	for _, g := range groups {
		switch {
		case g.Count > floor:
			out = append(out, g)
		case g.Count == floor && atFloor > 0:
			out = append(out, g)
			atFloor--
		}
	}
	return out, len(groups) - n
}
