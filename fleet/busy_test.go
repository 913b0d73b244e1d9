package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A tenant woken up by its notifications stays awake while its rows pour in,
// though the rates its sweeper reads next are still those of the tenth of a
// second it was asleep: then its slow sweeps (a slow broker) had sent fewer
// rows than were committed. Read on the rows alone, that tenth put it back to
// sleep at its next sweep, and, its commits no longer notifying, it could not
// wake up again: the lock went while rows were being sent (CI, 2026-11-27).
func TestBusyStaysAwakeOnTheRatesItWokeUpOn(t *testing.T) {
	m := &member{fleet: &Fleet{opts: Options{AwakeRate: 60}}}
	now := time.Now()
	m.rateAt = now
	later := func(d time.Duration) { now = now.Add(d) }

	// Asleep: 10 notifications in 120 ms (83 a second, over AwakeRate), and
	// its sweeps sent 3 rows (25 a second, under half of it).
	later(120 * time.Millisecond)
	m.notes.Store(10)
	require.True(t, m.busy(now, 3), "woken up at 83 notifications a second")

	// Its next sweep comes before a tenth of a second: the rates are those
	// read above. Awake, its commits stop notifying.
	later(40 * time.Millisecond)
	require.True(t, m.busy(now, 50), "put back to sleep on the rows it sent while asleep")

	// A tenth of a second after the first: no notification since, and rows
	// sent at 1,000 a second.
	later(60 * time.Millisecond)
	require.True(t, m.busy(now, 50), "awake at 1,000 rows a second")

	// Commits stop: the rates fall to nothing and it goes to sleep, and stays
	// so while neither notifications nor rows come.
	later(100 * time.Millisecond)
	require.False(t, m.busy(now, 0), "kept awake with no commit")
	later(100 * time.Millisecond)
	require.False(t, m.busy(now, 0), "woken up with no commit")

	// Rows alone do not wake it (a trickle of large transactions): only its
	// notifications do.
	later(100 * time.Millisecond)
	m.notes.Add(2)
	require.False(t, m.busy(now, 500), "woken up by 20 notifications a second")
}
