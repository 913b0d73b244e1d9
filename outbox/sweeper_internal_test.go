package outbox

import (
	"context"
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

// scriptedLock is an AwakeLock whose Acquire succeeds while up, and whose
// Release reads running as the transactions running then.
type scriptedLock struct {
	up, held bool
	running  string
	asked    []string // the lists Settled was asked about
}

func (l *scriptedLock) Acquire(context.Context) bool {
	l.held = l.up
	return l.held
}

func (l *scriptedLock) Release(context.Context) (string, bool) {
	if !l.held {
		return "", false
	}
	l.held = false
	return l.running, true
}

func (l *scriptedLock) Settled(_ context.Context, running string) bool {
	l.asked = append(l.asked, running)
	return false
}

// A sweeper that lets its lock go waits out the transactions running then
// (their commits, having seen the lock held, notify no one), even if it wakes
// up again meanwhile and cannot take the lock (its session down): that lock's
// release reads no list, and dropping the wait left their rows to the host's
// reconciliation.
func TestStayAwakeKeepsItsWaitWhenTheLockCannotBeTakenAgain(t *testing.T) {
	ctx := context.Background()
	lock := &scriptedLock{up: true, running: "1234"}
	var st stayAwake
	lingered := func() { st.busy = time.Now().Add(-2 * lingerFor) }

	st.swept(ctx, lock, true, true, true, true) // pressed: awake, the lock taken
	require.True(t, st.awake && lock.held)
	lingered()
	st.swept(ctx, lock, false, false, true, true) // nothing for lingerFor: let go
	require.True(t, st.settling && st.running == "1234", "the wait for the transactions running at the release")

	lock.up = false
	st.swept(ctx, lock, true, true, true, false) // pressed again, the lock not taken
	require.True(t, st.awake)
	require.False(t, lock.held)
	require.True(t, st.settling && st.running == "1234", "the wait dropped when the lock could not be taken")
	lingered()
	st.swept(ctx, lock, false, false, true, false) // its release, of a lock not held
	require.True(t, st.settling && st.running == "1234", "the wait dropped by the release of a lock not held")
	st.settled(ctx, lock)
	require.Equal(t, []string{"1234"}, lock.asked)

	lock.up = true
	st.swept(ctx, lock, true, true, true, false) // taken again: its release will read the list
	require.True(t, lock.held)
	require.False(t, st.settling)
}
