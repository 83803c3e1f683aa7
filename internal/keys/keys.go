// Package keys spells the Redis keys of jobthrottle's limiters and semaphores, and reads
// and writes the two texts the operator's tools share with the library: the control key
// (a pause and an override) and the record (a key's algorithm and limits). The scripts in
// lua/ write the same texts; docs/design.md lists every key.
package keys

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultPrefix is the text put before every key unless WithKeyPrefix says otherwise.
const DefaultPrefix = "jobthrottle:"

// MaxLen is the longest prefix and key together, in bytes. Every call sends the key's
// name several times (state, control, record and the other algorithms' keys).
const MaxLen = 512

// Suffixes of the keys under a hash tag, and of the pub/sub channel.
const (
	SlidingWindow  = "sw"    // list: the permit log
	SlidingCounter = "sc"    // list: the permit log, by sub-bucket
	TokenBucket    = "tb"    // string: the token bucket
	FixedWindow    = "fw"    // string: the fixed window's counts
	Leases         = "sem"   // sorted set: a semaphore's leases
	Queue          = "semq"  // sorted set: a semaphore's queue
	QueueExpiry    = "semx"  // sorted set: when each place in the queue lapses
	ControlKey     = "pause" // string: the control key (see Control)
	RecordKey      = "conf"  // string: the record (see Record)
	Booking        = "bk:"   // string: a task's booking; the task's id follows
	Wake           = "wake"  // the channel of wake-ups (semaphore handoffs, resumes)
)

// States returns the state suffixes of the four algorithms.
func States() []string {
	return []string{SlidingWindow, SlidingCounter, TokenBucket, FixedWindow}
}

// Suffixes returns the suffixes of every key under a tag but the bookings, whose
// names depend on their task: the four states, the semaphore's three sets, the
// control key and the record, in that order.
func Suffixes() []string {
	return append(States(), Leases, Queue, QueueExpiry, ControlKey, RecordKey)
}

// Split reads name as "{<prefix><key>}:<suffix>" with a suffix of this package (a
// booking's included) and returns the key and the suffix; ok is false for any other
// name. A key may itself hold "}:": the tag is taken to end at the first "}:" that
// leaves a known suffix after it.
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

// Type returns the Redis type of the key with suffix s ("list", "string", "zset"), or
// "" for a suffix that is not jobthrottle's.
func Type(s string) string {
	switch {
	case s == SlidingWindow || s == SlidingCounter:
		return "list"
	case s == Leases || s == Queue || s == QueueExpiry:
		return "zset"
	case s == TokenBucket || s == FixedWindow || s == ControlKey || s == RecordKey ||
		strings.HasPrefix(s, Booking) && len(s) > len(Booking):
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

// Name returns the key with suffix s under tag.
func Name(tag, s string) string { return tag + ":" + s }

// Control is the control key's content: a pause and an operator's override of the rates.
type Control struct {
	PauseEnd int64     // when the pause ends, µs of the server's clock; 0: none
	Override *Override // nil: none
}

// Override is an operator's override of the rates of a key's limits.
type Override struct {
	End   int64  // when it ends, µs
	Rates []Rate // the rates of limits 1..len(Rates), in order
	Set   int64  // when it was set, µs; 0: not recorded
}

// Rate is one limit's overridden rate and burst (0: the rate).
type Rate struct{ Rate, Burst int }

// ParseControl reads the control key's text: "<pause_end>", or
// "<pause_end> <override_end> <m> <r1> <b1> ... <rm> <bm> [<set>]", every number a plain
// decimal integer below 2^53 written without leading zeros, each rate 1..10^9 and each
// burst 0..10^9 (0: the rate). The scripts (lua/common.lua) take exactly these texts; any
// other is foreign to both.
func ParseControl(text string) (Control, error) {
	f := strings.Fields(text)
	var c Control
	n := make([]int64, len(f))
	for i, w := range f {
		v, err := strconv.ParseInt(w, 10, 64)
		if err != nil || v < 0 || v >= 1<<53 || w != strconv.FormatInt(v, 10) {
			return Control{}, fmt.Errorf("control key %q: %q is not a number", text, w)
		}
		n[i] = v
	}
	switch {
	case len(n) == 1:
		c.PauseEnd = n[0]
		return c, nil
	case len(n) < 5:
		return Control{}, fmt.Errorf("control key %q: too short", text)
	}
	m := int(n[2])
	if m < 1 || m > 16 || (len(n) != 3+2*m && len(n) != 4+2*m) {
		return Control{}, fmt.Errorf("control key %q: %d limits in %d fields", text, m, len(n))
	}
	o := &Override{End: n[1]}
	for i := 0; i < m; i++ {
		r, b := n[3+2*i], n[4+2*i]
		if r < 1 || r > 1e9 || b > 1e9 {
			return Control{}, fmt.Errorf("control key %q: limit %d's rate %d or burst %d out of range", text, i+1, r, b)
		}
		o.Rates = append(o.Rates, Rate{int(r), int(b)})
	}
	if len(n) == 4+2*m {
		o.Set = n[3+2*m]
	}
	c.PauseEnd, c.Override = n[0], o
	return c, nil
}

// String returns the control key's text (see ParseControl).
func (c Control) String() string {
	s := strconv.FormatInt(c.PauseEnd, 10)
	if o := c.Override; o != nil {
		s += " " + strconv.FormatInt(o.End, 10) + " " + strconv.Itoa(len(o.Rates))
		for _, r := range o.Rates {
			s += " " + strconv.Itoa(r.Rate) + " " + strconv.Itoa(r.Burst)
		}
		if o.Set != 0 {
			s += " " + strconv.FormatInt(o.Set, 10)
		}
	}
	return s
}

// Record is what a key's record says: the algorithm (by its state suffix), the
// sub-buckets of a sliding counter, and the limits of the Limiters that use the key, as
// the last process to write it had them.
type Record struct {
	State   string // sw, sc, tb or fw
	Buckets int
	Limits  []Limit
}

// Limit is one limit of a record: Rate per Period, and a token bucket's Burst (0: Rate).
type Limit struct {
	Rate   int
	Period time.Duration
	Burst  int
}

// ParseRecord reads a record's text: "1 <state> <buckets> <limit>...", each limit
// RATE/PERIOD or RATE/PERIOD:BURST with the period as time.Duration prints it, e.g.
// "1 sw 50 20/1.1s".
func ParseRecord(text string) (Record, error) {
	f := strings.Fields(text)
	if len(f) < 4 || f[0] != "1" {
		return Record{}, fmt.Errorf("record %q: not a version-1 record", text)
	}
	r := Record{State: f[1]}
	if !slices.Contains(States(), r.State) {
		return Record{}, fmt.Errorf("record %q: algorithm %q", text, f[1])
	}
	b, err := strconv.Atoi(f[2])
	if err != nil || b < 1 {
		return Record{}, fmt.Errorf("record %q: buckets %q", text, f[2])
	}
	r.Buckets = b
	for _, s := range f[3:] {
		rate, rest, ok := strings.Cut(s, "/")
		period, burst, hasBurst := strings.Cut(rest, ":")
		var l Limit
		var e1, e2, e3 error
		l.Rate, e1 = strconv.Atoi(rate)
		l.Period, e2 = time.ParseDuration(period)
		if hasBurst {
			l.Burst, e3 = strconv.Atoi(burst)
		}
		if !ok || e1 != nil || e2 != nil || e3 != nil || l.Rate < 1 || l.Period <= 0 || l.Burst < 0 {
			return Record{}, fmt.Errorf("record %q: limit %q", text, s)
		}
		r.Limits = append(r.Limits, l)
	}
	return r, nil
}

// String returns the record's text (see ParseRecord).
func (r Record) String() string {
	parts := []string{"1", r.State, strconv.Itoa(r.Buckets)}
	for _, l := range r.Limits {
		s := strconv.Itoa(l.Rate) + "/" + l.Period.String()
		if l.Burst != 0 {
			s += ":" + strconv.Itoa(l.Burst)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// Check returns nil when a key with suffix s, of Redis type typ (as TYPE names it),
// has the form jobthrottle's scripts write and read, judged by values: a string's
// text; a list's elements; a sorted set's members and scores, alternately, each score
// as strconv.FormatFloat(score, 'f', -1, 64) writes it. values may be a sample (say
// the first and last elements of a long list). Otherwise the error says why the key
// is foreign: another type, or content jobthrottle does not write (the scripts fail
// a call that meets such a key with JTSTATE, or WRONGTYPE, and the operator's tools
// leave it alone). The forms:
//
//	sw, sc     list of decimal integers: the permit log
//	tb         string: "<last> <oend>", then five decimal integers per limit (lua/bucket.lua)
//	fw         string of decimal integers joined by ' '
//	pause      string: see ParseControl
//	conf       string: see ParseRecord
//	bk:<id>    string: "<token> <n> <stamp>" or "<token> <n>", decimal integers
//	sem        sorted set: lease id (32 lowercase hex digits) -> integer score (µs)
//	semq, semx sorted set: "<lease id>:<ttl µs>" -> integer score (µs)
func Check(s, typ string, values []string) error {
	want := Type(s)
	switch {
	case want == "":
		return fmt.Errorf("%q is not a jobthrottle suffix", s)
	case typ != want:
		return fmt.Errorf("a %s, not a %s", typ, want)
	}
	if typ == "zset" {
		if len(values)%2 != 0 {
			return errors.New("members without scores")
		}
		for i := 0; i < len(values); i += 2 {
			m, score := values[i], values[i+1]
			id, ttl, hasTTL := strings.Cut(m, ":")
			if len(id) != 32 || !isHex(id, 32) || hasTTL != (s != Leases) || hasTTL && !isDecimal(ttl) {
				return fmt.Errorf("member %q is not a lease id", m)
			}
			if !isDecimal(strings.TrimPrefix(score, "-")) {
				return fmt.Errorf("member %q has score %s, not whole microseconds", m, score)
			}
		}
		return nil
	}
	if typ == "list" {
		for i, v := range values {
			if !isDecimal(v) {
				return fmt.Errorf("element %d %q is not a count or a time", i, v)
			}
		}
		return nil
	}
	if len(values) != 1 {
		return fmt.Errorf("%d values for a string", len(values))
	}
	text := values[0]
	var err error
	switch {
	case s == ControlKey:
		_, err := ParseControl(text) // its errors quote the text
		return err
	case s == RecordKey:
		_, err := ParseRecord(text)
		return err
	case s == TokenBucket: // "<last> <oend>" and five integers per limit, tokens maybe negative
		f := strings.Split(text, " ")
		for i, w := range f {
			if i%5 == 2 {
				w = strings.TrimPrefix(w, "-")
			}
			if !isDecimal(w) {
				err = errors.New("not a token bucket's state")
			}
		}
		if len(f) < 7 || (len(f)-2)%5 != 0 {
			err = errors.New("not a token bucket's state")
		}
	case s == FixedWindow:
		if !allDecimal(strings.Split(text, " "), 1) {
			err = errors.New("not a fixed window's counts")
		}
	default: // a booking
		if f := strings.Split(text, " "); !allDecimal(f, 2) || len(f) > 3 {
			err = errors.New("not a booking")
		}
	}
	if err != nil {
		return fmt.Errorf("text %q: %w", text, err)
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
