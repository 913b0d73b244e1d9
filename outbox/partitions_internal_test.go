package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestHistoryWidthIsASeventhOfTheRetentionFromASecondToADay(t *testing.T) {
	t.Parallel()
	require.Equal(t, 24*time.Hour, historyWidth(RetentionDefault), "a week: a day")
	require.Equal(t, 24*time.Hour, historyWidth(30*24*time.Hour), "at most a day")
	require.Equal(t, time.Hour, historyWidth(7*time.Hour))
	require.Equal(t, time.Second, historyWidth(2*time.Second), "at least a second")
	require.Equal(t, 2*time.Second, historyWidth(15*time.Second), "whole seconds")
	require.Equal(t, 24*time.Hour, historyWidth(-1), "kept forever: a day")
}

func TestPlanPartitionsCoversNowAndTwoAheadWithoutOverlap(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		require.NoError(t, err)
		return v
	}
	ptr := func(v time.Time) *time.Time { return &v }
	now := at("2026-11-25T14:30:10Z")
	h := time.Hour

	// None yet: the current hour and the next two.
	require.Equal(t, [][2]time.Time{
		{at("2026-11-25T14:00:00Z"), at("2026-11-25T15:00:00Z")},
		{at("2026-11-25T15:00:00Z"), at("2026-11-25T16:00:00Z")},
		{at("2026-11-25T16:00:00Z"), at("2026-11-25T17:00:00Z")},
	}, planPartitions(nil, nil, now, h, 2))

	// Made by an earlier run: nothing to do.
	made := []historyPartition{
		{name: "d", isDefault: true},
		{lower: ptr(at("2026-11-25T14:00:00Z")), upper: ptr(at("2026-11-25T15:00:00Z"))},
		{lower: ptr(at("2026-11-25T15:00:00Z")), upper: ptr(at("2026-11-25T16:00:00Z"))},
		{lower: ptr(at("2026-11-25T16:00:00Z")), upper: ptr(at("2026-11-25T17:00:00Z"))},
	}
	require.Empty(t, planPartitions(made, nil, now, h, 2))

	// The width changed (a new --retention): day-wide partitions made before
	// are kept, and the new ones start where they end.
	day := []historyPartition{{lower: ptr(at("2026-11-25T00:00:00Z")), upper: ptr(at("2026-11-26T00:00:00Z"))}}
	require.Empty(t, planPartitions(day, nil, now, h, 2))
	require.Equal(t, [][2]time.Time{
		{at("2026-11-26T00:00:00Z"), at("2026-11-26T01:00:00Z")},
		{at("2026-11-26T01:00:00Z"), at("2026-11-26T02:00:00Z")},
	}, planPartitions(day, nil, at("2026-11-25T23:30:00Z"), h, 2))
	// And narrower ones made before a wider width: the gap up to the next
	// partition is filled, never overlapped.
	narrow := []historyPartition{{lower: ptr(at("2026-11-25T14:00:00Z")), upper: ptr(at("2026-11-25T14:10:00Z"))},
		{lower: ptr(at("2026-11-25T15:20:00Z")), upper: ptr(at("2026-11-25T15:30:00Z"))}}
	require.Equal(t, [][2]time.Time{
		{at("2026-11-25T14:10:00Z"), at("2026-11-25T15:00:00Z")},
		{at("2026-11-25T15:00:00Z"), at("2026-11-25T15:20:00Z")},
		{at("2026-11-25T15:30:00Z"), at("2026-11-25T16:00:00Z")},
		{at("2026-11-25T16:00:00Z"), at("2026-11-25T17:00:00Z")},
	}, planPartitions(narrow, nil, now, h, 2))

	// Rows in the DEFAULT partition (no partition took them): the current
	// partition starts after the newest, which it may not hold, and a
	// minute ahead of the clock, past the moves landing in DEFAULT while
	// it is attached: one stamped past its lower bound would fail.
	require.Equal(t, [][2]time.Time{
		{at("2026-11-25T14:31:10Z"), at("2026-11-25T15:00:00Z")},
		{at("2026-11-25T15:00:00Z"), at("2026-11-25T16:00:00Z")},
		{at("2026-11-25T16:00:00Z"), at("2026-11-25T17:00:00Z")},
	}, planPartitions(nil, ptr(at("2026-11-25T14:30:05.5Z")), now, h, 2))
	// With a second's width, still two ahead past that start.
	s := time.Second
	require.Equal(t, [][2]time.Time{
		{at("2026-11-25T14:31:10Z"), at("2026-11-25T14:31:11Z")},
		{at("2026-11-25T14:31:11Z"), at("2026-11-25T14:31:12Z")},
		{at("2026-11-25T14:31:12Z"), at("2026-11-25T14:31:13Z")},
	}, planPartitions(nil, ptr(at("2026-11-25T14:30:09Z")), now, s, 2))
}
