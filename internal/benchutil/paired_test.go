package benchutil

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPairedRatiosDivideByTheWindowsAloneAround(t *testing.T) {
	t.Parallel()
	// A machine that slows linearly over the run: alone 10, 20, 40; beside
	// twice the alone around it.
	got := PairedRatios([]float64{10, 20, 40}, []float64{2 * math.Sqrt(10*20), 2 * math.Sqrt(20*40)})
	require.InDeltaSlice(t, []float64{2, 2}, got, 1e-9)
	require.Panics(t, func() { PairedRatios([]float64{1, 2}, []float64{1, 2}) })
}

func TestMedianIntervalCoverage(t *testing.T) {
	t.Parallel()
	// n = 8: X(2)..X(7) holds the median with 1 - 2·9/256.
	lo, med, hi, cov := MedianInterval([]float64{8, 1, 7, 2, 6, 3, 5, 4}, 0.9)
	require.Equal(t, 2.0, lo)
	require.Equal(t, 4.5, med)
	require.Equal(t, 7.0, hi)
	require.InDelta(t, 1-18.0/256, cov, 1e-12)
	// n = 10 at 0.95: X(2)..X(9), 1 - 2·11/1024.
	xs := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	lo, _, hi, cov = MedianInterval(xs, 0.95)
	require.Equal(t, 2.0, lo)
	require.Equal(t, 9.0, hi)
	require.InDelta(t, 1-22.0/1024, cov, 1e-12)
	// Too few for the level: the whole range, and what it holds.
	lo, _, hi, cov = MedianInterval([]float64{3, 1, 2}, 0.9)
	require.Equal(t, 1.0, lo)
	require.Equal(t, 3.0, hi)
	require.InDelta(t, 0.75, cov, 1e-12)
}

func TestVerdict(t *testing.T) {
	t.Parallel()
	require.Equal(t, "met", Verdict(0.9, 1.4, 1.5))
	require.Equal(t, "missed", Verdict(1.6, 2.4, 1.5))
	require.Equal(t, "undecided", Verdict(1.2, 1.8, 1.5))
	require.Equal(t, "met", VerdictAtLeast(0.8, 1.1, 0.8))
	require.Equal(t, "missed", VerdictAtLeast(0.5, 0.79, 0.8))
	require.Equal(t, "undecided", VerdictAtLeast(0.7, 0.9, 0.8))
}
