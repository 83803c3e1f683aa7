package waiter

import (
	"math"
	"testing"
	"time"
)

// The numbers vendors write: decimal seconds (Retry-After, resets) and OpenAI's
// durations.
func TestParseNumbers(t *testing.T) {
	const max = time.Duration(math.MaxInt64)
	seconds := []struct {
		v       string
		d       time.Duration
		neg, ok bool
	}{
		{"0", 0, false, true},
		{"120", 120 * time.Second, false, true},
		{"007", 7 * time.Second, false, true},
		{"2.0", 2 * time.Second, false, true},
		{"1.5", 1500 * time.Millisecond, false, true},
		{"0.123456789", 123456789, false, true},
		{"0.1234567891", 123456790, false, true}, // beyond the nanosecond: rounded up
		{"0.1234567890", 123456789, false, true},
		{"-5", 5 * time.Second, true, true},
		{"-0", 0, true, true},
		{"9223372036", 9223372036 * time.Second, false, true},
		{"9223372036.854775807", max, false, true},
		{"9223372036.9", max, false, true}, // overflows in the fraction: saturates
		{"9223372037", max, false, true},
		{"99999999999999999999999", max, false, true},
		{"", 0, false, false},
		{"-", 0, false, false},
		{"1.", 0, false, false},
		{".5", 0, false, false},
		{"+5", 0, false, false},
		{"1e3", 0, false, false},
		{" 1", 0, false, false},
		{"١", 0, false, false}, // a digit, but not an ASCII one
	}
	for _, c := range seconds {
		d, neg, ok := parseSeconds(c.v)
		if d != c.d && c.ok || neg != c.neg && c.ok || ok != c.ok {
			t.Errorf("parseSeconds(%q) = %v, %v, %v; want %v, %v, %v", c.v, d, neg, ok, c.d, c.neg, c.ok)
		}
	}
	durations := []struct {
		v  string
		d  time.Duration
		ok bool
	}{
		{"1s", time.Second, true},
		{"6m0s", 6 * time.Minute, true},
		{"20ms", 20 * time.Millisecond, true},
		{"1.5s", 1500 * time.Millisecond, true},
		{"1h2m3.5s", time.Hour + 2*time.Minute + 3500*time.Millisecond, true},
		{"1d2h", 26 * time.Hour, true},
		{"0.5d", 12 * time.Hour, true},
		{"300us", 300 * time.Microsecond, true},
		{"300µs", 300 * time.Microsecond, true},
		{"7ns", 7, true},
		{"1.5ns", 1, true},
		{"17", 17 * time.Second, true},
		{"0", 0, true},
		{"99999999999999999h", max, true},
		{"200000d", max, true},
		{"9223372036s1s", max, true},
		{"", 0, false},
		{"-1s", 0, false},
		{"+1s", 0, false},
		{"s", 0, false},
		{"1", time.Second, true},
		{"1x", 0, false},
		{"1s ", 0, false},
		{"1..5s", 0, false},
		{"1w", 0, false},
	}
	for _, c := range durations {
		d, ok := parseDuration(c.v)
		if d != c.d && c.ok || ok != c.ok {
			t.Errorf("parseDuration(%q) = %v, %v; want %v, %v", c.v, d, ok, c.d, c.ok)
		}
	}
}
