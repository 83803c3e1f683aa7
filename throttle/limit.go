package throttle

import (
	"cmp"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
)

// Limit is a rate: at most Rate permits per Period.
//
// A limit counts calls (the n of AllowN, WaitN, Reserve) unless it names a Unit: then it
// counts what calls cost in that unit (Cost, WaitCost), "100,000 tokens per
// minute" being Limit{Rate: 100000, Period: time.Minute, Unit: "tokens"}. A limiter may
// hold limits of several units; a call takes from all of them at once or from none.
//
// Period is used in whole microseconds, rounded up. Bounds: 1 <= Rate <= 10^9,
// 1µs <= Period <= 2^45µs (about 407 days), 0 <= Burst <= 10^9, and for TokenBucket
// Burst × Period in microseconds at most 2^50; a Unit is 1 to 32 of a-z, 0-9, '_', '.'
// and '-'. New returns an error wrapping ErrInvalidLimit for anything else.
type Limit struct {
	Rate   int           // permits per Period, > 0
	Period time.Duration // > 0
	Burst  int           // TokenBucket: permits available at once after idling; 0 means Rate. Ignored by the others.
	Unit   string        // what the limit counts: "" calls, else a cost's unit (such as "tokens")
}

// PerSecond returns a limit of rate permits per second.
func PerSecond(rate int) Limit { return Limit{Rate: rate, Period: time.Second} }

// PerMinute returns a limit of rate permits per minute.
func PerMinute(rate int) Limit { return Limit{Rate: rate, Period: time.Minute} }

// PerHour returns a limit of rate permits per hour.
func PerHour(rate int) Limit { return Limit{Rate: rate, Period: time.Hour} }

// Every returns a limit of one permit per interval.
func Every(interval time.Duration) Limit { return Limit{Rate: 1, Period: interval} }

// String returns the limit as "10 per 1s", with a unit "100000 tokens per 1m0s" and,
// with a burst, "10 per 1s (burst 20)".
func (l Limit) String() string {
	s := fmt.Sprintf("%d per %s", l.Rate, l.Period)
	if l.Unit != "" {
		s = fmt.Sprintf("%d %s per %s", l.Rate, l.Unit, l.Period)
	}
	if l.Burst != 0 {
		s += fmt.Sprintf(" (burst %d)", l.Burst)
	}
	return s
}

const (
	maxRate     = 1_000_000_000
	maxPeriodUS = 1 << 45
	maxBucketUS = 1 << 50 // burst × period for the token bucket
)

// periodMicros is the period in whole microseconds, rounded up.
func (l Limit) periodMicros() int64 { return ceilMicros(l.Period) }

// ceilMicros is d in whole microseconds, rounded up (without overflowing near the
// largest Duration, as d + 999ns would).
func ceilMicros(d time.Duration) int64 {
	us := int64(d / time.Microsecond)
	if d%time.Microsecond > 0 {
		us++
	}
	return us
}

// burst is the token bucket's capacity: Burst, or Rate when Burst is 0.
func (l Limit) burst() int { return cmp.Or(l.Burst, l.Rate) }

// validate reports why the limit cannot be used with algorithm a, wrapping ErrInvalidLimit.
func (l Limit) validate(a Algorithm) error {
	switch {
	case l.Rate <= 0 || l.Rate > maxRate:
		return fmt.Errorf("%w: rate %d is not in 1..%d", ErrInvalidLimit, l.Rate, maxRate)
	case l.Period <= 0:
		return fmt.Errorf("%w: period %s is not positive", ErrInvalidLimit, l.Period)
	case l.periodMicros() > maxPeriodUS:
		return fmt.Errorf("%w: period %s is above 2^45µs", ErrInvalidLimit, l.Period)
	case l.Burst < 0 || l.Burst > maxRate:
		return fmt.Errorf("%w: burst %d is not in 0..%d", ErrInvalidLimit, l.Burst, maxRate)
	case a == TokenBucket && int64(l.burst()) > maxBucketUS/l.periodMicros(): // burst × period > 2^50
		return fmt.Errorf("%w: burst %d × period %s is above 2^50µs", ErrInvalidLimit, l.burst(), l.Period)
	case l.Unit != "" && keys.CheckUnit(l.Unit) != nil:
		return fmt.Errorf("%w: %v", ErrInvalidLimit, keys.CheckUnit(l.Unit))
	}
	return nil
}
