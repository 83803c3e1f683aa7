package jobmw

import (
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// Limit is what a middleware needs to know of a limiter besides booking from it.
type Limit struct {
	Key   string
	Desc  string        // "20 per 1s and 500 per 1h0m0s"
	Grace time.Duration // how long after its slot a returning job may still run on it
	// Paced are the limits the pacer keeps each process's starts within; nil for a
	// token bucket (it may grant Burst at once) or a limit above maxPacedRate.
	Paced []PeriodRate
}

// PeriodRate is one limit: Rate starts in any window of Period.
type PeriodRate struct {
	Rate   int
	Period time.Duration
}

// InfoOf returns what a middleware needs to know of lim, given how long after its
// slot a returning job may still run on it (grace, bounded here by a quarter of the
// limit's shortest period).
func InfoOf(lim *throttle.Limiter, grace time.Duration) Limit {
	limits := lim.Limits()
	s := make([]string, len(limits))
	li := Limit{Key: lim.Key(), Grace: grace}
	paced := lim.Algorithm() != throttle.TokenBucket
	for i, l := range limits {
		s[i] = l.String()
		li.Grace = min(li.Grace, l.Period/4)
		if l.Rate > maxPacedRate {
			paced = false
		}
		li.Paced = append(li.Paced, PeriodRate{l.Rate, l.Period})
	}
	li.Desc = strings.Join(s, " and ")
	if !paced {
		li.Paced = nil
	}
	return li
}
