// Package vec makes the metrics of x/metrics and its subpackages, so that they share
// one name prefix and one set of histogram buckets.
package vec

import "github.com/prometheus/client_golang/prometheus"

// prefix begins every metric's name.
const prefix = "jobthrottle_"

// buckets cover a permit due at once to one booked minutes ahead, in seconds.
var buckets = []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// Counter returns the counter vector jobthrottle_<name>.
func Counter(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + name, Help: help}, labels)
}

// Histogram returns the histogram vector jobthrottle_<name>, of durations in seconds.
func Histogram(name, help string, labels ...string) *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: prefix + name, Help: help, Buckets: buckets}, labels)
}

// Desc describes the gauge jobthrottle_<name>, made at scrape time.
func Desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prefix+name, help, labels, nil)
}
