package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A parked sweeper waits for no tick, but still for its polls, even one
// that falls after the tick: an awake sweeper that parks keeps polling until
// it lets its lock go (TestAParkedAwakeSweeperPollsUntilItLetsItsLockGo runs
// the whole loop, where the cursor's reread poll often hides its absence).
func TestSweepAtKeepsAParkedSweepersPollsPastItsTick(t *testing.T) {
	now := time.Now()
	tick := now.Add(2 * time.Millisecond)
	soon, late := now.Add(time.Millisecond), now.Add(4*time.Millisecond)

	require.Equal(t, late, sweepAt(tick, true, late), "parked: its poll after the tick it does not wait for")
	require.Equal(t, soon, sweepAt(tick, true, late, soon), "parked: the earliest of its polls")
	require.True(t, sweepAt(tick, true).IsZero(), "parked with no poll: a wake-up alone")

	require.Equal(t, tick, sweepAt(tick, false, late), "not parked: the tick, before a later poll")
	require.Equal(t, soon, sweepAt(tick, false, late, soon), "not parked: a poll before the tick")
	require.Equal(t, tick, sweepAt(tick, false), "not parked, no poll: the tick")
}
