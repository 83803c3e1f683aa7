// Package keys spells the Redis keys of jobthrottle's limiters and semaphores, and reads
// and writes the texts the operator's tools share with the library: a limiter's head
// (its algorithm and limits) and meta (the head, a pause, an override, the fair share's
// clock, operators' weights). The scripts in lua/ write the same texts;
// internal/protocol and docs/design.md list every key.
package keys

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultPrefix is the text put before every key unless WithKeyPrefix says otherwise.
const DefaultPrefix = "jobthrottle:"

// MaxLen is the longest prefix and key together, in bytes.
const MaxLen = 512

// MaxTenant is the longest tenant name, in bytes.
const MaxTenant = 256

// Suffixes of the keys under a hash tag, and of the pub/sub channel.
const (
	State       = "l"    // a limiter's state and meta: a list (sliding window, counter) or a string
	Tenant      = "t:"   // a tenant's state (its caps); the tenant's name follows
	Part        = "u:"   // the state of a unit's limits: "u:<unit>", a tenant's caps' "u:<unit>:<name>"
	Settled     = "st:"  // string: a settle's record; its id follows
	FairQueue   = "q"    // sorted set: the tenants with requests ahead, by finish tag
	Booking     = "bk:"  // string: a task's booking or ticket; the task's id follows
	Leases      = "sem"  // sorted set: a semaphore's leases
	Queue       = "semq" // sorted set: a semaphore's queue
	QueueExpiry = "semx" // sorted set: when each place in the queue lapses
	Wake        = "wake" // the channel of wake-ups (semaphore handoffs, pauses, resumes)
)

// The algorithms' head tags.
const (
	SlidingWindow  = "sw"
	SlidingCounter = "sc"
	TokenBucket    = "tb"
	FixedWindow    = "fw"
)

// Algorithms returns the head tags of the four algorithms.
func Algorithms() []string {
	return []string{SlidingWindow, SlidingCounter, TokenBucket, FixedWindow}
}

// Split reads name as "{<prefix><key>}:<suffix>" with a suffix of this package (a
// booking's or a tenant's included) and returns the key and the suffix; ok is false for
// any other name. A key may itself hold "}:": the tag is taken to end at the first "}:"
// that leaves a known suffix after it.
func Split(prefix, name string) (key, suffix string, ok bool) {
	rest, found := strings.CutPrefix(name, "{"+prefix)
	if !found {
		return "", "", false
	}
	for i := 0; ; {
		j := strings.Index(rest[i:], "}:")
		if j < 0 {
			return "", "", false
		}
		i += j
		if key, suffix = rest[:i], rest[i+2:]; key != "" && Type(suffix) != "" {
			return key, suffix, true
		}
		i++
	}
}

// Type returns the Redis types a key with suffix s may have ("list or string" for a
// state, "zset", "string"), or "" for a suffix that is not jobthrottle's.
func Type(s string) string {
	switch {
	case s == State, strings.HasPrefix(s, Tenant) && len(s) > len(Tenant):
		return "list or string"
	case strings.HasPrefix(s, Part):
		unit, _, _ := strings.Cut(s[len(Part):], ":")
		if CheckUnit(unit) == nil {
			return "list or string"
		}
	case s == FairQueue || s == Leases || s == Queue || s == QueueExpiry:
		return "zset"
	case strings.HasPrefix(s, Booking) && len(s) > len(Booking), strings.HasPrefix(s, Settled) && len(s) > len(Settled):
		return "string"
	}
	return ""
}

// Tag returns "{<prefix><key>}", which every key of the limiter or semaphore starts with,
// so that Redis Cluster hashes only it: the tag ends at the first "}" after its opening
// brace, the same place in every key. It is an error for the key to be empty, for prefix
// and key to start with "}" (the tag would be empty), or to be longer than MaxLen.
func Tag(prefix, key string) (string, error) {
	switch {
	case key == "":
		return "", errors.New("empty key")
	case strings.HasPrefix(prefix+key, "}"):
		return "", fmt.Errorf("%q: prefix and key must not start with '}'", prefix+key)
	case len(prefix)+len(key) > MaxLen:
		return "", fmt.Errorf("prefix and key are %d bytes, at most %d", len(prefix)+len(key), MaxLen)
	}
	return "{" + prefix + key + "}", nil
}

// CheckTenant returns why name cannot name a tenant, or nil: it must hold 1 to
// MaxTenant bytes.
func CheckTenant(name string) error {
	if name == "" || len(name) > MaxTenant {
		return fmt.Errorf("tenant name of %d bytes, want 1 to %d", len(name), MaxTenant)
	}
	return nil
}

// MaxUnit is the longest unit name, in bytes.
const MaxUnit = 32

// CheckUnit returns why name cannot name a unit, or nil: 1 to MaxUnit bytes of lowercase
// letters, digits, '_', '.' and '-'.
func CheckUnit(name string) error {
	if name == "" || len(name) > MaxUnit || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789_.-") != "" {
		return fmt.Errorf("unit %q: want 1 to %d of a-z, 0-9, '_', '.' and '-'", name, MaxUnit)
	}
	return nil
}

// Name returns the key with suffix s under tag.
func Name(tag, s string) string { return tag + ":" + s }

// Head is what a limiter's callers send and its state keeps as its meta's first line:
// the algorithm (by its tag), the sub-buckets of a sliding counter, and the limits.
type Head struct {
	Alg     string // sw, sc, tb or fw
	Buckets int    // sc only: the sub-buckets of the shortest period
	Limits  []Limit
}

// Limit is one limit of a head: Rate per Period, and a token bucket's Burst; Unit is
// what it counts ("": calls).
type Limit struct {
	Rate   int
	Period time.Duration // whole µs
	Burst  int           // tb only
	Unit   string
}

// String returns the head's text: "<alg> [<buckets>] <limit>...", each limit its rate,
// its period in µs and, for tb, its burst, all as decimal integers: "sw 20 1000000",
// "tb 10 1000000 20", "sc 50 100 60000000"; the limits of a unit follow "/<unit>": "sw
// 600 60000000 /tokens 100000 60000000". The limits of calls come first, and each unit's
// together (the scripts refuse a unit twice).
func (h Head) String() string {
	b := []byte(h.Alg)
	if h.Alg == SlidingCounter {
		b = strconv.AppendInt(append(b, ' '), int64(h.Buckets), 10)
	}
	unit := ""
	for _, l := range h.Limits {
		if l.Unit != unit {
			b, unit = append(append(b, " /"...), l.Unit...), l.Unit
		}
		b = strconv.AppendInt(append(b, ' '), int64(l.Rate), 10)
		b = strconv.AppendInt(append(b, ' '), l.Period.Microseconds(), 10)
		if h.Alg == TokenBucket {
			b = strconv.AppendInt(append(b, ' '), int64(l.Burst), 10)
		}
	}
	return string(b)
}

// ParseHead reads a head's text (see Head.String).
func ParseHead(text string) (Head, error) {
	f := strings.Split(text, " ")
	h := Head{Alg: f[0]}
	if !slices.Contains(Algorithms(), h.Alg) {
		return Head{}, fmt.Errorf("head %q: algorithm %q", text, h.Alg)
	}
	f = f[1:]
	if h.Alg == SlidingCounter {
		if len(f) == 0 {
			return Head{}, fmt.Errorf("head %q: no buckets", text)
		}
		b, err := strconv.Atoi(f[0])
		if err != nil || b < 1 {
			return Head{}, fmt.Errorf("head %q: buckets %q", text, f[0])
		}
		h.Buckets, f = b, f[1:]
	}
	width := 2
	if h.Alg == TokenBucket {
		width = 3
	}
	unit, seen := "", map[string]bool{}
	for i := 0; i < len(f); {
		if u, ok := strings.CutPrefix(f[i], "/"); ok {
			if CheckUnit(u) != nil || seen[u] || i+1 == len(f) || strings.HasPrefix(f[i+1], "/") {
				return Head{}, fmt.Errorf("head %q: unit %q", text, f[i])
			}
			unit, seen[u], i = u, true, i+1
			continue
		}
		if i+width > len(f) {
			return Head{}, fmt.Errorf("head %q: a limit of fewer than %d numbers", text, width)
		}
		var n [3]int64
		for j := range width {
			v, err := strconv.ParseInt(f[i+j], 10, 64)
			if err != nil || v < 1 || v >= 1<<53 {
				return Head{}, fmt.Errorf("head %q: %q is not a positive integer", text, f[i+j])
			}
			n[j] = v
		}
		h.Limits = append(h.Limits, Limit{Rate: int(n[0]), Period: time.Duration(n[1]) * time.Microsecond, Burst: int(n[2]), Unit: unit})
		i += width
	}
	if len(h.Limits) == 0 || len(h.Limits) > 16 {
		return Head{}, fmt.Errorf("head %q: %d limits", text, len(h.Limits))
	}
	return h, nil
}

// Meta is what a limiter's state says besides its data: its head and, while they matter,
// a pause, an operator's override, the fair share's clock and operators' weights for
// tenants.
type Meta struct {
	Head     string    // the head's text, as the last writer sent it (see ParseHead)
	PauseEnd int64     // when a pause ends, µs of the server's clock; 0: none
	Override *Override // nil: none
	Fair     *Fair     // nil: no tenant has requests queued
	Weights  []Weight  // operators' weights for tenants, in force until their ends (an ended one stays while its tenant may hold a place under it)
	// Drift is another process's head that the last writer replaced (other limits on
	// the same key), and when; "" when none was lately.
	Drift   string
	DriftAt int64
}

// Override is an operator's override of the rates of a key's limits.
type Override struct {
	End   int64  // when it ends, µs
	Set   int64  // when it was set, µs
	Rates []Rate // the rates of limits 1..len(Rates), in order
}

// Rate is one limit's overridden rate and burst (0: the rate).
type Rate struct{ Rate, Burst int }

// Fair is the fair share's clock (lua/limiter.lua): its virtual time V, the weight W of
// the tenants queued (millionths), when V was counted, and the largest finish tag queued.
type Fair struct {
	V    float64
	W    int64
	At   int64
	Fmax float64
}

// Weight is an operator's weight for a tenant, in millionths, until End (µs).
type Weight struct {
	Tenant string
	Units  int64
	End    int64
}

// ParseMeta reads a meta text: the head, then lines "p <pause_end>", "o <end> <set> <r1>
// <b1> ...", "f <V> <W> <at> <Fmax>", "d <at> <head>" and "w <end> <units> <len> <name>"
// (the name may hold any bytes), as the scripts write them.
func ParseMeta(text string) (Meta, error) {
	head, rest, _ := strings.Cut(text, "\n")
	if _, err := ParseHead(head); err != nil {
		return Meta{}, err
	}
	m := Meta{Head: head}
	for rest != "" {
		kind, line := rest[0], ""
		if kind == 'w' {
			f := strings.SplitN(rest, " ", 5)
			if len(f) != 5 {
				return Meta{}, fmt.Errorf("meta %q: weight line", text)
			}
			end, e1 := strconv.ParseInt(f[1], 10, 64)
			units, e2 := strconv.ParseInt(f[2], 10, 64)
			n, e3 := strconv.Atoi(f[3])
			if e1 != nil || e2 != nil || e3 != nil || n < 1 || n > len(f[4]) {
				return Meta{}, fmt.Errorf("meta %q: weight line", text)
			}
			m.Weights = append(m.Weights, Weight{Tenant: f[4][:n], Units: units, End: end})
			rest = strings.TrimPrefix(f[4][n:], "\n")
			continue
		}
		line, rest, _ = strings.Cut(rest, "\n")
		f := strings.Fields(line)
		bad := fmt.Errorf("meta %q: line %q", text, line)
		switch kind {
		case 'p':
			if len(f) != 2 {
				return Meta{}, bad
			}
			v, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return Meta{}, bad
			}
			m.PauseEnd = v
		case 'o':
			n, err := ints(f[1:])
			if err != nil || len(n) < 4 || len(n)%2 != 0 {
				return Meta{}, bad
			}
			o := &Override{End: n[0], Set: n[1]}
			for i := 2; i < len(n); i += 2 {
				o.Rates = append(o.Rates, Rate{int(n[i]), int(n[i+1])})
			}
			m.Override = o
		case 'd':
			at, head, ok := strings.Cut(strings.TrimPrefix(line, "d "), " ")
			v, err := strconv.ParseInt(at, 10, 64)
			if !ok || err != nil {
				return Meta{}, bad
			}
			m.Drift, m.DriftAt = head, v
		case 'f':
			if len(f) != 5 {
				return Meta{}, bad
			}
			v, e1 := strconv.ParseFloat(f[1], 64)
			w, e2 := strconv.ParseInt(f[2], 10, 64)
			at, e3 := strconv.ParseInt(f[3], 10, 64)
			fmax, e4 := strconv.ParseFloat(f[4], 64)
			if e1 != nil || e2 != nil || e3 != nil || e4 != nil || math.IsNaN(v) || math.IsNaN(fmax) {
				return Meta{}, bad
			}
			m.Fair = &Fair{V: v, W: w, At: at, Fmax: fmax}
		default:
			return Meta{}, bad
		}
	}
	return m, nil
}

func ints(f []string) ([]int64, error) {
	out := make([]int64, len(f))
	for i, w := range f {
		v, err := strconv.ParseInt(w, 10, 64)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// Check returns nil when a key with suffix s, of Redis type typ (as TYPE names it), has
// the form jobthrottle's scripts write and read, judged by values: a string's text; a
// list's elements (its meta first); a sorted set's members and scores, alternately, each
// score as strconv.FormatFloat(score, 'f', -1, 64) writes it. values may be a sample (the
// first and last elements of a long list). Otherwise the error says why the key is
// foreign: another type, or content jobthrottle does not write (the scripts fail a call
// that meets such a key, and the operator's tools leave it alone). The forms:
//
//	l, t:<name>   list [meta, base, T1, S1, ...] of a sliding window or counter, or [meta]
//	              alone; or string "<numbers>\n<meta>" of a token bucket or fixed window
//	u:<unit>[:<name>]  a unit's limits' state, as l's (its meta the part's head)
//	bk:<id>       string: "<token> <n> <stamp>", or "t <ticket> <n>", each followed by
//	              the costs of its acquire: " u<unit>:<n>" each
//	st:<id>       string: "1", a settle's record
//	q             sorted set: "<units> <name>" -> finish tag
//	sem           sorted set: lease id (32 lowercase hex digits) -> integer score (µs)
//	semq, semx    sorted set: "<lease id>:<ttl µs>" -> integer score (µs)
func Check(s, typ string, values []string) error {
	want := Type(s)
	switch {
	case want == "":
		return fmt.Errorf("%q is not a jobthrottle suffix", s)
	case !strings.Contains(want, typ):
		return fmt.Errorf("a %s, not a %s", typ, want)
	}
	switch {
	case typ == "zset":
		if len(values)%2 != 0 {
			return errors.New("members without scores")
		}
		for i := 0; i < len(values); i += 2 {
			m, score := values[i], values[i+1]
			if s == FairQueue {
				u, name, ok := strings.Cut(m, " ")
				if _, err := strconv.ParseFloat(score, 64); !ok || !isDecimal(u) || CheckTenant(name) != nil || err != nil {
					return fmt.Errorf("member %q is not a queued tenant", m)
				}
				continue
			}
			id, ttl, hasTTL := strings.Cut(m, ":")
			if len(id) != 32 || !isHex(id, 32) || hasTTL != (s != Leases) || hasTTL && !isDecimal(ttl) {
				return fmt.Errorf("member %q is not a lease id", m)
			}
			if !isDecimal(strings.TrimPrefix(score, "-")) {
				return fmt.Errorf("member %q has score %s, not whole microseconds", m, score)
			}
		}
		return nil
	case typ == "list":
		if len(values) == 0 {
			return errors.New("an empty list")
		}
		m, err := ParseMeta(values[0])
		if err != nil {
			return err
		}
		if len(values) > 1 && !strings.HasPrefix(m.Head, SlidingWindow+" ") && !strings.HasPrefix(m.Head, SlidingCounter+" ") {
			return fmt.Errorf("a list whose head %q is not a log's", m.Head)
		}
		for i, v := range values[1:] {
			if !isDecimal(v) {
				return fmt.Errorf("element %d %q is not a count or a time", i+1, v)
			}
		}
		return nil
	}
	if len(values) != 1 {
		return fmt.Errorf("%d values for a string", len(values))
	}
	text := values[0]
	if strings.HasPrefix(s, Settled) {
		if text != "1" {
			return fmt.Errorf("text %q: not a settle's record", text)
		}
		return nil
	}
	if strings.HasPrefix(s, Booking) {
		f := strings.Split(text, " ")
		n := 3
		if f[0] == "t" {
			f, n = f[1:], 2
		}
		for len(f) > n { // the costs
			unit, c, ok := strings.Cut(strings.TrimPrefix(f[len(f)-1], "u"), ":")
			if !ok || !strings.HasPrefix(f[len(f)-1], "u") || CheckUnit(unit) != nil || !isDecimal(c) {
				break
			}
			f = f[:len(f)-1]
		}
		if len(f) == n && allDecimal(f, n) {
			return nil
		}
		return fmt.Errorf("text %q: not a booking", text)
	}
	nums, meta, ok := strings.Cut(text, "\n")
	if !ok {
		return fmt.Errorf("text %q: not a state", text)
	}
	m, err := ParseMeta(meta)
	if err != nil {
		return err
	}
	if nums == "" {
		return nil
	}
	if !strings.HasPrefix(m.Head, TokenBucket+" ") && !strings.HasPrefix(m.Head, FixedWindow+" ") {
		return fmt.Errorf("a string whose head %q is not a bucket's or a window's", m.Head)
	}
	if strings.HasPrefix(m.Head, TokenBucket+" ") { // a unit's notes for refunds: " r <R> <Z> [<t> <v>]..."
		if n, notes, ok := strings.Cut(nums, " r "); ok {
			if f := strings.Split(notes, " "); len(f)%2 == 1 || !allDecimal(f, len(f)) {
				return fmt.Errorf("text %q: %q are not a bucket's notes", text, notes)
			}
			nums = n
		}
	}
	for _, w := range strings.Split(nums, " ") {
		if !isDecimal(strings.TrimPrefix(w, "-")) {
			return fmt.Errorf("text %q: %q is not a number", text, w)
		}
	}
	return nil
}

// isDecimal reports whether w is a non-negative decimal integer of at most 17 digits
// (the scripts' numbers stay below 2^53).
func isDecimal(w string) bool {
	return w != "" && len(w) <= 17 && strings.Trim(w, "0123456789") == ""
}

// isHex reports whether w is a lowercase hex integer of at most n digits.
func isHex(w string, n int) bool {
	return w != "" && len(w) <= n && strings.Trim(w, "0123456789abcdef") == ""
}

// allDecimal reports whether f holds at least n words, each isDecimal.
func allDecimal(f []string, n int) bool {
	if len(f) < n {
		return false
	}
	for _, w := range f {
		if !isDecimal(w) {
			return false
		}
	}
	return true
}
