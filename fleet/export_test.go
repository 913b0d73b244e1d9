package fleet

import (
	"maps"
	"slices"
	"time"
)

// ReconcilePasses is how many reconciliation passes are done.
func (f *Fleet) ReconcilePasses() int64 { return f.passes.Load() }

// SharedBreakers lists the outboxes whose topic breaker the fleet keeps
// apart as shared through Redis (the ones breakersTryAgain looks at).
func (f *Fleet) SharedBreakers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.shared))
}

// WithoutSlices leaves out of o's reconciliation the passes over every
// parked outbox in turn: what the insert counts find, alone.
func WithoutSlices(o Options) Options {
	o.turns = -1
	return o
}

// InTurnEvery has o's reconciliation ask every parked outbox in turn once in
// passes passes.
func InTurnEvery(o Options, passes int) Options {
	o.turns = passes
	return o
}

// Asking has hook called with the schemas each of o's reconciliation passes
// is about to ask, once their insert counts are read.
func Asking(o Options, hook func(schemas []string)) Options {
	o.asking = hook
	return o
}

// MaintainEach bounds each outbox's retention and probe in o's maintenance
// rounds.
func MaintainEach(o Options, d time.Duration) Options {
	o.maintainEach = d
	return o
}
