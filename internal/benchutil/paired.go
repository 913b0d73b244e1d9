package benchutil

import (
	"math"
	"slices"
)

// PairedRatios returns, for each window beside (beside[i], measured between
// alone[i] and alone[i+1]), its value over the geometric mean of the two
// windows alone around it: a drift of the machine over the run, linear
// within a pair, cancels, where a ratio of the pooled sides counted it. It
// needs one more window alone than beside.
func PairedRatios(alone, beside []float64) []float64 {
	if len(alone) != len(beside)+1 {
		panic("benchutil.PairedRatios: want one more window alone than beside")
	}
	out := make([]float64, len(beside))
	for i, b := range beside {
		out[i] = b / math.Sqrt(alone[i]*alone[i+1])
	}
	return out
}

// MedianInterval returns the median of xs and an interval that holds the
// true median with at least the probability level, distribution-free: the
// order statistics X(k) and X(n+1-k) for the largest k whose coverage,
// 1 - 2·P(Binomial(n, ½) < k), reaches level, and that coverage. With too few
// values for level (n = 4 reaches 0.875 at most), the interval is the whole
// range and the coverage says what it holds.
func MedianInterval(xs []float64, level float64) (lo, median, hi, coverage float64) {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n == 0 {
		return math.NaN(), math.NaN(), math.NaN(), 0
	}
	median = (s[(n-1)/2] + s[n/2]) / 2
	k, cov := 1, medianCoverage(n, 1)
	for j := 2; j <= (n+1)/2; j++ {
		c := medianCoverage(n, j)
		if c < level {
			break
		}
		k, cov = j, c
	}
	return s[k-1], median, s[n-k], cov
}

// medianCoverage is P(X(k) <= median <= X(n+1-k)) for n values of any
// continuous distribution: 1 - 2·P(Binomial(n, ½) < k).
func medianCoverage(n, k int) float64 {
	below, c := 0.0, 1.0 // c: C(n, j)
	for j := range k {
		if j > 0 {
			c = c * float64(n-j+1) / float64(j)
		}
		below += c
	}
	return 1 - 2*below/math.Pow(2, float64(n))
}

// Verdict says what an interval of a ratio says of a goal that the ratio
// stay at or under goal: "met" when the whole interval is, "missed" when
// none of it is, and "undecided" when it straddles the goal.
func Verdict(lo, hi, goal float64) string {
	switch {
	case hi <= goal:
		return "met"
	case lo > goal:
		return "missed"
	default:
		return "undecided"
	}
}

// VerdictAtLeast is Verdict for a goal that the ratio reach at least goal.
func VerdictAtLeast(lo, hi, goal float64) string {
	switch {
	case lo >= goal:
		return "met"
	case hi < goal:
		return "missed"
	default:
		return "undecided"
	}
}
