package main

import (
	"math"
	"slices"
	"sort"
	"time"
)

// median returns the median of xs (NaN for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile returns the p-th percentile (0 < p <= 100, nearest rank) of sorted ds.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// meanOf returns the mean of ds (0 for none).
func meanOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum / time.Duration(len(ds))
}

// jain is Jain's fairness index of xs: (Σx)² / (n·Σx²), 1 when all are equal.
func jain(xs []int) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return math.NaN()
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// utilization is the share of rate used in the whole periods after the first one that
// lie inside the span of sorted ts: the grants in [first+p, first+(k+1)p) over k·rate,
// k = floor((last-first)/p) - 1. NaN when the span holds no such period.
func utilization(sorted []time.Time, p time.Duration, rate int) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	first, last := sorted[0], sorted[len(sorted)-1]
	k := int(last.Sub(first)/p) - 1
	if k < 1 {
		return math.NaN()
	}
	from, to := first.Add(p), first.Add(time.Duration(k+1)*p)
	n := 0
	for _, t := range sorted {
		if !t.Before(from) && t.Before(to) {
			n++
		}
	}
	return float64(n) / float64(k*rate)
}
