package waiter

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// WithRateLimitHeaders makes the transport read the rate-limit headers many APIs send
// with every answer, and pause the Reserver (holding this process at once, as for a
// Retry-After) until the quota resets when they say at most reserve requests are
// left in it. A fleet that shares a vendor's quota with other clients then stops
// before the vendor has to refuse it. Set reserve to about the requests the fleet may
// have in flight at once, so that those sent while the pause reaches the other
// processes still fit; 0 pauses only when the quota is spent. reserve must not be
// negative (an error wrapping ErrInvalidOption otherwise).
//
// The forms understood, the first present wins:
//
//	RateLimit: "default";r=0;t=30        IETF httpapi draft (-08 and later): r remaining,
//	                                     t seconds to reset; with several policies the
//	                                     longest reset among those at or under reserve
//	RateLimit: limit=100, remaining=0, reset=30          the same draft, -07
//	RateLimit-Remaining: 0  + RateLimit-Reset: 30         the same draft, -06 and earlier
//	X-RateLimit-Remaining: 0 + X-RateLimit-Reset-After: 1.5   seconds, fractions allowed
//	X-RateLimit-Remaining: 0 + X-RateLimit-Reset: 1767323045  Unix seconds (GitHub style),
//	                                     counted from the response's Date when valid
//	X-RateLimit-Remaining: 0 + X-RateLimit-Reset: 30      seconds, for a value below 10^9
//
// (X-Rate-Limit-* spellings are read as X-RateLimit-*.) RateLimit-Policy and
// X-RateLimit-Limit only describe the quota and are not needed. Headers that cannot
// be read are reported to TransportHooks.BadRateLimit (ErrRateLimitInvalid) and
// ignored; a spent quota without a usable reset (none, or one in the past) is
// reported (ErrRateLimitNoReset) and sets no pause; a reset beyond the cap
// (WithMaxPause) pauses for the cap and is reported (ErrRateLimitTooLong). Shopify's
// X-Shopify-Shop-Api-Call-Limit and leaky-bucket headers are not understood.
func WithRateLimitHeaders(reserve int) TransportOption {
	return transportOption(func(t *transport) {
		if t.check(reserve >= 0, "%w: rate-limit reserve %d, want >= 0", ErrInvalidOption, reserve) {
			t.reserve = reserve
		}
	})
}

var (
	// ErrRateLimitInvalid: a rate-limit header could not be read (not a number, a
	// negative count…); it was ignored. See WithRateLimitHeaders.
	ErrRateLimitInvalid = errors.New("waiter: unreadable rate-limit header")

	// ErrRateLimitNoReset: the rate-limit headers said the quota is spent but gave no
	// reset time, or one in the past; nothing was paused.
	ErrRateLimitNoReset = errors.New("waiter: quota spent with no usable reset time")

	// ErrRateLimitTooLong: the quota resets later than the transport's cap
	// (WithMaxPause); the pause was cut to the cap.
	ErrRateLimitTooLong = errors.New("waiter: quota resets later than the transport's cap")
)

// epochSeconds is where an X-RateLimit-Reset stops being a count of seconds and
// becomes a Unix time (2001-09-09): no quota window is 31 years long.
const epochSeconds = 1_000_000_000

// quotaReset returns how long the response's rate-limit headers say the quota stays
// spent (0: it is not, or they say nothing usable), cut to the cap, and why the
// headers could not be used as they stood.
func (t *transport) quotaReset(h http.Header) (time.Duration, error) {
	var (
		d   time.Duration
		err error
	)
	switch {
	case h.Get("RateLimit") != "":
		d, err = t.ietfQuota(h.Get("RateLimit"))
	case h.Get("RateLimit-Remaining") != "":
		d, err = t.pairQuota(h, "RateLimit-Remaining", "RateLimit-Reset", "", false)
	case h.Get("X-RateLimit-Remaining") != "":
		d, err = t.pairQuota(h, "X-RateLimit-Remaining", "X-RateLimit-Reset", "X-RateLimit-Reset-After", true)
	case h.Get("X-Rate-Limit-Remaining") != "":
		d, err = t.pairQuota(h, "X-Rate-Limit-Remaining", "X-Rate-Limit-Reset", "X-Rate-Limit-Reset-After", true)
	default:
		return 0, nil
	}
	if err != nil || d <= 0 {
		return 0, err
	}
	if d > t.maxPause {
		return t.maxPause, fmt.Errorf("%w: %v, paused %v", ErrRateLimitTooLong, d, t.maxPause)
	}
	return d, nil
}

// ietfQuota reads a RateLimit header: a list of `"policy";r=N;t=S` items (draft -08
// and later), or the dictionary `limit=L, remaining=N, reset=S` (draft -07).
func (t *transport) ietfQuota(v string) (time.Duration, error) {
	items := strings.Split(v, ",")
	if !strings.Contains(v, ";") { // draft -07: one dictionary
		var rem, reset string
		for _, it := range items {
			k, val, _ := strings.Cut(strings.TrimSpace(it), "=")
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "remaining":
				rem = strings.TrimSpace(val)
			case "reset":
				reset = strings.TrimSpace(val)
			}
		}
		if rem == "" {
			return 0, fmt.Errorf("%w: RateLimit %q has no remaining", ErrRateLimitInvalid, v)
		}
		return t.spentFor(rem, reset, "RateLimit "+strconv.Quote(v))
	}
	var longest time.Duration
	var firstErr error
	for _, it := range items {
		var rem, reset string
		params := strings.Split(it, ";")
		for _, p := range params[1:] {
			k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
			switch strings.TrimSpace(k) {
			case "r":
				rem = strings.TrimSpace(val)
			case "t":
				reset = strings.TrimSpace(val)
			}
		}
		if rem == "" {
			if firstErr == nil {
				firstErr = fmt.Errorf("%w: RateLimit %q: an item has no r", ErrRateLimitInvalid, v)
			}
			continue
		}
		d, err := t.spentFor(rem, reset, "RateLimit "+strconv.Quote(v))
		if err != nil && firstErr == nil {
			firstErr = err
		}
		longest = max(longest, d)
	}
	if longest > 0 {
		return longest, nil
	}
	return 0, firstErr
}

// spentFor returns the time to reset (delta seconds) when remaining is at or under the
// reserve, else 0; what names the header in errors.
func (t *transport) spentFor(remaining, reset, what string) (time.Duration, error) {
	rem, err := strconv.ParseInt(remaining, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || rem < 0 {
		return 0, fmt.Errorf("%w: %s: remaining %q", ErrRateLimitInvalid, what, remaining)
	}
	if rem > int64(t.reserve) || err != nil {
		return 0, nil
	}
	if reset == "" {
		return 0, fmt.Errorf("%w: %s", ErrRateLimitNoReset, what)
	}
	secs, err := strconv.ParseUint(reset, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%w: %s: reset %q", ErrRateLimitInvalid, what, reset)
	}
	return secondsToDuration(float64(secs)), nil
}

// pairQuota reads a remaining header with a reset header (delta seconds; Unix seconds
// too when epochOK and the value is large) or a reset-after header (seconds,
// fractions allowed), which wins when present.
func (t *transport) pairQuota(h http.Header, remName, resetName, afterName string, epochOK bool) (time.Duration, error) {
	remaining := strings.TrimSpace(h.Get(remName))
	what := fmt.Sprintf("%s %q", remName, remaining)
	rem, err := strconv.ParseInt(remaining, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) || rem < 0 {
		return 0, fmt.Errorf("%w: %s", ErrRateLimitInvalid, what)
	}
	if rem > int64(t.reserve) || err != nil {
		return 0, nil
	}
	if afterName != "" {
		if v := strings.TrimSpace(h.Get(afterName)); v != "" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 || math.IsNaN(f) {
				return 0, fmt.Errorf("%w: %s, %s %q", ErrRateLimitInvalid, what, afterName, v)
			}
			return secondsToDuration(f), nil
		}
	}
	v := strings.TrimSpace(h.Get(resetName))
	if v == "" {
		return 0, fmt.Errorf("%w: %s, no %s", ErrRateLimitNoReset, what, resetName)
	}
	secs, err := strconv.ParseUint(v, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("%w: %s, %s %q", ErrRateLimitInvalid, what, resetName, v)
	}
	if !epochOK || secs < epochSeconds {
		return secondsToDuration(float64(secs)), nil
	}
	from := t.clock.Now()
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		from = date
	}
	d := time.Unix(int64(min(secs, math.MaxInt64/2)), 0).Sub(from)
	if secs > math.MaxInt64/2 { // absurd: far beyond any cap
		d = math.MaxInt64
	}
	if d < 0 {
		return 0, fmt.Errorf("%w: %s, %s %q is %v before %s", ErrRateLimitNoReset, what, resetName, v, -d, from.UTC().Format(http.TimeFormat))
	}
	return d, nil
}

// secondsToDuration converts seconds to a Duration, saturating.
func secondsToDuration(s float64) time.Duration {
	if s >= float64(math.MaxInt64)/float64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}
