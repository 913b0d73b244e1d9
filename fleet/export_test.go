package fleet

import (
	"maps"
	"slices"
)

// SharedBreakers lists the outboxes whose topic breaker the fleet keeps
// apart as shared through Redis (the ones breakersTryAgain looks at).
func (f *Fleet) SharedBreakers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.shared))
}
