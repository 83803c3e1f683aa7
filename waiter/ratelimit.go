package waiter

import (
	"cmp"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// WithRateLimitHeaders makes the transport read the rate-limit headers many APIs send
// with every answer (the IETF RateLimit drafts, X-RateLimit-* as GitHub, X and Discord
// send them, OpenAI's and Anthropic's; docs/http.md lists them) and back off, as for
// a refusal, until the quota resets when they say at most reserve requests are left.
// A fleet that shares a vendor's quota with other clients then stops before the vendor
// has to refuse it. Set reserve to about the requests the fleet may have in flight at
// once; 0 backs off only when the quota is spent. Token quotas are passed to
// TransportHooks.Quota, and paused on only with WithCost (see there). Headers that
// cannot be used go to TransportHooks.BadHeader. reserve must not be negative (an error wrapping
// ErrInvalidOption otherwise).
func WithRateLimitHeaders(reserve int) TransportOption {
	return checked(reserve >= 0, func(t *transport) { t.reserve = reserve }, "rate-limit reserve %d, want >= 0", reserve)
}

// resetForm is how a family of headers writes its reset.
type resetForm int

const (
	deltaSeconds   resetForm = iota // seconds from now (IETF drafts)
	secondsOrEpoch                  // seconds, or Unix seconds from epochSeconds on (X-RateLimit-Reset)
	goDuration                      // "6m0s", "20ms" (OpenAI)
	rfc3339                         // "2026-01-02T03:04:05Z" (Anthropic)
	delayOrDate                     // seconds, or an HTTP date (Retry-After)
)

// family is a pair of rate-limit headers: what is left of a quota and when it resets.
// resetAfter, when set and present, wins over reset (Discord's seconds, fractions
// allowed).
type family struct {
	remaining, reset, resetAfter string // canonical header names
	form                         resetForm
}

// requestFamilies are the request quotas read after the RateLimit header, the first
// present winning.
var requestFamilies = []family{
	{"Ratelimit-Remaining", "Ratelimit-Reset", "", deltaSeconds},
	{"X-Ratelimit-Remaining", "X-Ratelimit-Reset", "X-Ratelimit-Reset-After", secondsOrEpoch},
	{"X-Rate-Limit-Remaining", "X-Rate-Limit-Reset", "X-Rate-Limit-Reset-After", secondsOrEpoch},
	{"X-Ratelimit-Remaining-Requests", "X-Ratelimit-Reset-Requests", "", goDuration},
	{"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset", "", rfc3339},
}

// tokenFamilies are the token quotas passed to TransportHooks.Quota, all that are
// present, with the header of each one's limit.
var tokenFamilies = []struct {
	name, limit string
	family
}{
	{"tokens", "X-Ratelimit-Limit-Tokens", family{"X-Ratelimit-Remaining-Tokens", "X-Ratelimit-Reset-Tokens", "", goDuration}},
	{"tokens", "Anthropic-Ratelimit-Tokens-Limit", family{"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset", "", rfc3339}},
	{"input-tokens", "Anthropic-Ratelimit-Input-Tokens-Limit", family{"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset", "", rfc3339}},
	{"output-tokens", "Anthropic-Ratelimit-Output-Tokens-Limit", family{"Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset", "", rfc3339}},
}

// epochSeconds is where an X-RateLimit-Reset stops being a count of seconds and
// becomes a Unix time (2001-09-09): no quota window is 31 years long.
const epochSeconds = 1_000_000_000 * time.Second

// requestQuota returns how long the response's request quota headers say to back off
// with this reserve (0: not at all, or they say nothing usable), cut to the cap, and
// whether they say no request is left.
func (r *reader) requestQuota(reserve int) (d time.Duration, empty bool) {
	if v := r.h.Get("Ratelimit"); v != "" {
		return r.ietfQuota(v, int64(reserve))
	}
	for _, f := range requestFamilies {
		left, present, ok := r.count(f.remaining)
		if !present {
			continue
		}
		if !ok || left > int64(reserve) {
			return 0, false
		}
		d, ok := r.pauseFor(f)
		r.told = ok
		return d, left == 0
	}
	return 0, false
}

// count reads header name, a count of what is left: present reports whether the
// header is there, ok whether it reads as a count (it is reported when not).
func (r *reader) count(name string) (n int64, present, ok bool) {
	v := strings.TrimSpace(r.h.Get(name))
	if v == "" {
		return 0, false, false
	}
	if n, ok = parseCount(v); !ok {
		r.report(name, v, "unreadable", 0)
	}
	return n, true, ok
}

// parseCount reads a count of what is left: a non-negative integer, a huge one
// reading as math.MaxInt64 (plenty); 0 and false for anything else.
func parseCount(v string) (int64, bool) {
	n, err := strconv.ParseInt(v, 10, 64)
	if errors.Is(err, strconv.ErrRange) && n > 0 {
		return math.MaxInt64, true
	}
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// pauseFor returns the pause f's reset asks for, cut to the cap, or reports it and
// returns 0 and false.
func (r *reader) pauseFor(f family) (time.Duration, bool) {
	name, v, d, problem := r.resetIn(f)
	if problem != "" {
		r.report(name, v, problem, 0)
		return 0, false
	}
	return r.capped(name, v, d), true
}

// resetIn reads f's reset: the header it was read from, its text, how long from now it
// says, and what was wrong with it ("" for nothing; d is then 0).
func (r *reader) resetIn(f family) (name, v string, d time.Duration, problem string) {
	name, form := f.reset, f.form
	if f.resetAfter != "" && r.h.Get(f.resetAfter) != "" {
		name, form = f.resetAfter, deltaSeconds
	}
	v = strings.TrimSpace(r.h.Get(name))
	if v == "" && form != delayOrDate { // judge reads a Retry-After only when present: blank is unreadable
		return f.reset, "", 0, "missing"
	}
	var neg, ok bool
	switch form {
	case deltaSeconds, secondsOrEpoch:
		d, neg, ok = parseSeconds(v)
		ok = ok && !neg
		if ok && form == secondsOrEpoch && d >= epochSeconds {
			d = r.until(time.Unix(0, 0).Add(d))
		}
	case delayOrDate:
		if d, neg, ok = parseSeconds(v); neg {
			d = -d // in the past, unless it is 0
		} else if !ok {
			at, err := http.ParseTime(v)
			if ok = err == nil; ok {
				d = r.until(at)
			}
		}
	case goDuration:
		d, ok = parseDuration(v)
	case rfc3339:
		at, err := time.Parse(time.RFC3339, v)
		if ok = err == nil; ok {
			d = r.until(at)
		}
	}
	switch {
	case !ok:
		return name, v, 0, "unreadable"
	case d < 0:
		return name, v, 0, "in the past"
	}
	return name, v, d, ""
}

// ietfQuota reads a RateLimit header v: a list of `"policy";r=N;t=S` items (draft -08
// and later), the longest reset among the items at or under reserve winning; or the
// dictionary `limit=L, remaining=N, reset=S` (draft -07).
func (r *reader) ietfQuota(v string, reserve int64) (time.Duration, bool) {
	const name = "Ratelimit"
	items := strings.Split(v, ",")
	if !strings.Contains(v, ";") { // draft -07: one dictionary, one item
		items = []string{";" + strings.ReplaceAll(v, ",", ";")}
	}
	var longest time.Duration
	empty, problem := false, "" // the header is reported once, for its first fault
	for _, it := range items {
		var rem, reset string
		for _, p := range strings.Split(it, ";")[1:] {
			k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
			switch strings.ToLower(strings.TrimSpace(k)) {
			case "r", "remaining":
				rem = strings.TrimSpace(val)
			case "t", "reset":
				reset = strings.TrimSpace(val)
			}
		}
		n, ok := parseCount(rem)
		if !ok {
			problem = cmp.Or(problem, "unreadable")
			continue
		}
		if n > reserve {
			continue
		}
		empty = empty || n == 0
		d, neg, ok := parseSeconds(reset)
		switch {
		case reset == "":
			problem = cmp.Or(problem, "missing")
		case !ok || neg:
			problem = cmp.Or(problem, "unreadable")
		default:
			r.told = true
			longest = max(longest, d)
		}
	}
	if longest > 0 { // the items that could be read say when to come back
		return r.capped(name, v, longest), empty
	}
	if problem != "" {
		r.report(name, v, problem, 0)
	}
	return 0, empty
}

// tokenQuotas returns the token quotas the response states, and how long to back off
// for those of which less remains than the request's estimated cost in their unit,
// cut to the cap; a quota whose headers cannot be read is reported and left out.
//
// OpenAI and Anthropic state when a quota is full again, and refill it evenly until
// then: the pause lasts until the estimate is back, the reset's share of what is
// missing, or (the limit not stated) until the reset.
func (r *reader) tokenQuotas(cost map[string]int) ([]Quota, time.Duration) {
	var (
		qs    []Quota
		pause time.Duration
	)
	for _, f := range tokenFamilies {
		left, _, ok := r.count(f.remaining)
		if !ok { // absent, or reported
			continue
		}
		name, reset, d, problem := r.resetIn(f.family)
		if problem == "unreadable" {
			r.report(name, reset, problem, 0)
			continue
		}
		q := Quota{Name: f.name, Remaining: left, Reset: d}
		q.Limit, _, _ = r.count(f.limit) // 0 when absent or unreadable
		qs = append(qs, q)
		est, costed := cost[f.name]
		if !costed || left >= int64(est) || d <= 0 {
			continue
		}
		if q.Limit > left { // d × (est-left)/(limit-left), rounded up, never past d
			d = time.Duration(math.Ceil(float64(d) * math.Min(1, float64(int64(est)-left)/float64(q.Limit-left))))
		}
		pause = max(pause, r.capped(name, reset, d))
	}
	return qs, pause
}
