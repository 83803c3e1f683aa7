package waiter

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderError is a response header the transport could not use as it stood, passed to
// TransportHooks.BadHeader; the response is returned all the same. Header is the
// header's name in canonical form ("Retry-After", "X-Ratelimit-Reset"), Value its
// text ("" when missing), and Pause the pause the transport set all the same (0: none).
type HeaderError struct {
	Header string
	Value  string
	// Problem says what was wrong, and so what the transport did: "missing",
	// "unreadable", "in the past", "longer than the cap" or "too far from the local
	// clock" (docs/http.md, "Hooks", says when and what).
	Problem string
	Pause   time.Duration
}

func (e *HeaderError) Error() string {
	s := fmt.Sprintf("waiter: %s %q: %s", e.Header, e.Value, e.Problem)
	if e.Problem == "missing" {
		s = "waiter: missing: " + e.Header
	}
	if e.Pause > 0 {
		s += fmt.Sprintf("; paused %v", e.Pause)
	}
	return s
}

// Quota is a token quota a vendor's rate-limit headers describe, passed to
// TransportHooks.Quota: Name is "tokens", "input-tokens" or "output-tokens", Remaining
// what is left of it, Limit what it holds when full (0 when the headers do not say),
// and Reset how long after the response was read it is full again (0 when the headers
// do not say, or that time has passed).
type Quota struct {
	Name      string
	Remaining int64
	Limit     int64
	Reset     time.Duration
}

// A server's absolute times count from the local clock when its Date agrees with it to
// within Date's whole second, from its Date when that is off by up to maxDateSkew (the
// server's clock is off), and from the local clock again beyond, a Date that far off
// being more likely wrong than the clock (docs/http.md, "The Date header").
const maxDateSkew = 10 * time.Second

// reader reads one response's headers: it knows when the response was read, counts
// the server's times, and collects what it could not use.
type reader struct {
	h        http.Header
	now      time.Time // the local clock when the response was read
	maxPause time.Duration
	from     time.Time // what the server's absolute times count from; set on first use
	told     bool      // a spent quota's reset was read, though it may be now
	bad      []*HeaderError
}

// report notes a header that could not be used as it stood.
func (r *reader) report(name, value, problem string, pause time.Duration) {
	r.bad = append(r.bad, &HeaderError{Header: name, Value: value, Problem: problem, Pause: pause})
}

// until returns how long from when the response was read until at, a time by the
// server's clock (see maxDateSkew).
func (r *reader) until(at time.Time) time.Duration {
	if r.from.IsZero() {
		r.from = r.now
		v := r.h.Get("Date")
		if date, err := http.ParseTime(v); err == nil {
			switch lag := r.now.Sub(date); {
			case lag >= -time.Second && lag < 2*time.Second: // agrees, Date's fraction being cut off
			case lag.Abs() <= maxDateSkew:
				r.from = date
			default:
				r.report("Date", v, "too far from the local clock", 0) // its Pause is set once known
			}
		}
	}
	return at.Sub(r.from)
}

// capped returns d cut to the cap, reporting name's value when it was cut.
func (r *reader) capped(name, value string, d time.Duration) time.Duration {
	if d > r.maxPause {
		r.report(name, value, "longer than the cap", r.maxPause)
		return r.maxPause
	}
	return d
}

// parseSeconds reads a decimal number of seconds, 1*DIGIT ["." 1*DIGIT] ("120",
// "2.0"), and a leading "-" as negative, so that it is reported as in the past rather
// than unreadable. Digits past the nanosecond round up; a value beyond a Duration
// saturates.
func parseSeconds(v string) (d time.Duration, neg, ok bool) {
	if strings.HasPrefix(v, "-") {
		neg, v = true, v[1:]
	}
	digits := func(s string) bool { return s != "" && strings.TrimLeft(s, "0123456789") == "" }
	whole, frac, dot := strings.Cut(v, ".")
	if !digits(whole) || dot && !digits(frac) {
		return 0, false, false
	}
	secs, err := strconv.ParseUint(whole, 10, 64)
	if err != nil || secs > math.MaxInt64/uint64(time.Second) { // only a range error is left
		return math.MaxInt64, neg, true
	}
	frac += "000000000"
	nanos, _ := strconv.ParseInt(frac[:9], 10, 64)
	if strings.Trim(frac[9:], "0") != "" {
		nanos++ // below a nanosecond: round up, never early
	}
	d = time.Duration(secs)*time.Second + time.Duration(nanos)
	if d < 0 {
		d = math.MaxInt64
	}
	return d, neg, true
}

// parseDuration reads a reset as OpenAI writes it, a Go duration ("6m0s", "20ms",
// "1.5s"), days allowed ("1d2h"), or a bare number of seconds. It refuses signs; a
// value beyond a Duration saturates.
func parseDuration(v string) (time.Duration, bool) {
	if d, neg, ok := parseSeconds(v); ok {
		return d, !neg
	}
	if v == "" {
		return 0, false
	}
	isNum := func(c rune) bool { return c >= '0' && c <= '9' || c == '.' }
	var total time.Duration
	for v != "" {
		rest := strings.TrimLeftFunc(v, isNum)
		end := strings.IndexFunc(rest, isNum)
		if end < 0 {
			end = len(rest)
		}
		secs, _, ok := parseSeconds(v[:len(v)-len(rest)]) // in units of a second, exact to the nanosecond
		unit, known := durationUnits[rest[:end]]
		if !ok || !known {
			return 0, false
		}
		total += scale(secs, unit)
		if total < 0 { // two non-negative Durations overflowed: saturate
			total = math.MaxInt64
		}
		v = rest[end:]
	}
	return total, true
}

// durationUnits are the units parseDuration knows.
var durationUnits = map[string]time.Duration{
	"ns": time.Nanosecond, "us": time.Microsecond, "µs": time.Microsecond, "μs": time.Microsecond,
	"ms": time.Millisecond, "s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour,
}

// scale returns n units, n given as a Duration that counts seconds as units (so 1.5
// is 1500ms); saturating. Every unit divides a second or is a whole number of them.
func scale(n, unit time.Duration) time.Duration {
	if unit < time.Second {
		return n / (time.Second / unit)
	}
	if m := unit / time.Second; n <= math.MaxInt64/m {
		return n * m
	}
	return math.MaxInt64
}
