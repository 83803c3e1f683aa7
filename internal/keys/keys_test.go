package keys

import (
	"strings"
	"testing"
	"time"
)

func TestSplit(t *testing.T) {
	for _, c := range []struct {
		name, key, suffix string
		ok                bool
	}{
		{"{jobthrottle:vendor-api}:sw", "vendor-api", "sw", true},
		{"{jobthrottle:vendor-api}:pause", "vendor-api", "pause", true},
		{"{jobthrottle:mail}:bk:task-1", "mail", "bk:task-1", true},
		{"{jobthrottle:mail}:bk:a}:sw", "mail", "bk:a}:sw", true},   // a booking's id may hold "}:"
		{"{jobthrottle:a}:sw}:pause", "a}:sw", "pause", true},       // so may a key
		{"{jobthrottle:vendor-api}:other", "", "", false},           // not a suffix of ours
		{"{jobthrottle:vendor-api}:bk:", "", "", false},             // a booking without an id
		{"{other:vendor-api}:sw", "", "", false},                    // another prefix
		{"jobthrottle:vendor-api:sw", "", "", false},                // no tag
		{"{jobthrottle:}:sw", "", "", false},                        // an empty key
		{"{jobthrottle:vendor-api}:sw:x", "", "", false},            // more after the suffix
		{"{jobthrottle:vendor-api}", "", "", false},                 // no suffix
		{"{jobthrottle:vendor-api}:sem", "vendor-api", "sem", true}, // a semaphore's leases
	} {
		key, suffix, ok := Split("jobthrottle:", c.name)
		if key != c.key || suffix != c.suffix || ok != c.ok {
			t.Errorf("Split(%q) = %q, %q, %v; want %q, %q, %v", c.name, key, suffix, ok, c.key, c.suffix, c.ok)
		}
	}
}

func TestSuffixes(t *testing.T) {
	for _, s := range Suffixes() {
		if Type(s) == "" {
			t.Errorf("suffix %q has no type", s)
		}
	}
	if got, want := strings.Join(Suffixes(), " "), "sw sc tb fw sem semq semx pause conf"; got != want {
		t.Errorf("Suffixes() = %s; want %s", got, want)
	}
}

// Check takes what the scripts write (the texts below are copied from real keys) and
// turns away every other type and text.
func TestCheck(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef"
	for _, c := range []struct {
		suffix, typ string
		values      []string
		foreign     string // "" for ours, else a part of the error
	}{
		{"sw", "list", []string{"0", "1795795049994989", "3", "1795795050994989", "13"}, ""},
		{"sc", "list", nil, ""}, // an empty sample
		{"sw", "list", []string{"0", "hello"}, `element 1 "hello"`},
		{"sw", "list", []string{"-1"}, `element 0 "-1"`},
		{"sw", "string", []string{"1"}, "a string, not a list"},
		{"sc", "hash", nil, "a hash, not a list"},
		// "<last> <oend>", then per limit: tokens (ticks), rate, period, burst, latest booking
		{"tb", "string", []string{"1795795049994989 0 3000000 5 1000000 5 0"}, ""},
		{"tb", "string", []string{"1795795049994989 0 -12000000 5 1000000 5 1795795052394989"}, ""}, // booked ahead
		{"tb", "string", []string{"1795795049994989 1795795349994989 3000000 5 1000000 5 0 40 12 3600000000 12 0"}, ""},
		{"tb", "string", []string{"1795795049994989 0 3000000 -5 1000000 5 0"}, "not a token bucket"},  // a negative rate
		{"tb", "string", []string{"1795795049994989 0 3000000 5 1000000 5"}, "not a token bucket"},     // a limit cut short
		{"tb", "string", []string{"1795795049994989 0 3000000 5 1000000 5 0 1"}, "not a token bucket"}, // a field too many
		{"tb", "string", []string{"661f1e8ad4b6d:0:0"}, "not a token bucket"},                          // an older release's hex TAT
		{"tb", "string", []string{"hello"}, `text "hello": not a token bucket`},
		{"tb", "string", []string{"1:2"}, "not a token bucket"},
		{"tb", "list", []string{"1"}, "a list, not a string"},
		{"fw", "string", []string{"1795795049994989 4"}, ""},
		{"fw", "string", []string{"1795795049994989 4 7"}, ""},
		{"fw", "string", []string{"4.5"}, "not a fixed window"},
		{"fw", "zset", nil, "a zset, not a string"},
		{"pause", "string", []string{"1795795349994989"}, ""},
		{"pause", "string", []string{"0 1795795349994989 1 5 0 1795795049994989"}, ""},
		{"pause", "string", []string{"paused"}, `control key "paused"`},
		{"pause", "hash", nil, "a hash, not a string"},
		{"conf", "string", []string{"1 sw 50 20/1.1s"}, ""},
		{"conf", "string", []string{"{\"rate\": 10}"}, "not a version-1 record"},
		{"conf", "set", nil, "a set, not a string"},
		{"bk:task-1", "string", []string{"1795795049994989 1 1795795049000000"}, ""},
		{"bk:task-1", "string", []string{"1795795049994989 1"}, ""},
		{"bk:task-1", "string", []string{"done"}, "not a booking"},
		{"bk:task-1", "list", nil, "a list, not a string"},
		{"sem", "zset", []string{id, "1795795049994989"}, ""},
		{"sem", "zset", []string{"alice", "100"}, `member "alice" is not a lease id`},
		{"sem", "zset", []string{id, "1.5"}, "score 1.5, not whole microseconds"},
		{"sem", "zset", []string{id + ":30000000", "1795795049994989"}, "not a lease id"},
		{"sem", "string", []string{"x"}, "a string, not a zset"},
		{"semq", "zset", []string{id + ":30000000", "1795795049994989"}, ""},
		{"semq", "zset", []string{id, "1795795049994989"}, "not a lease id"},
		{"semx", "zset", []string{id + ":30s", "1795795049994989"}, "not a lease id"},
		{"semx", "list", nil, "a list, not a zset"},
		{"wake", "string", []string{"x"}, "not a jobthrottle suffix"},
	} {
		err := Check(c.suffix, c.typ, c.values)
		switch {
		case c.foreign == "" && err != nil:
			t.Errorf("Check(%s, %s, %q) = %v; want nil", c.suffix, c.typ, c.values, err)
		case c.foreign != "" && (err == nil || !strings.Contains(err.Error(), c.foreign)):
			t.Errorf("Check(%s, %s, %q) = %v; want an error with %q", c.suffix, c.typ, c.values, err, c.foreign)
		}
	}
}

func TestControlRoundTrip(t *testing.T) {
	for _, text := range []string{
		"1795795349994989",
		"0 1795795349994989 1 5 0",
		"0 1795795349994989 2 5 0 7 9 1795795049994989",
	} {
		c, err := ParseControl(text)
		if err != nil {
			t.Fatalf("ParseControl(%q): %v", text, err)
		}
		if got := c.String(); got != text {
			t.Errorf("ParseControl(%q).String() = %q", text, got)
		}
	}
	for _, text := range []string{"", "x", "1 2", "-1", "01", "0 1 2 3 4", "0 1 17 1 1"} {
		if _, err := ParseControl(text); err == nil {
			t.Errorf("ParseControl(%q) succeeded", text)
		}
	}
}

func TestRecordRoundTrip(t *testing.T) {
	r, err := ParseRecord("1 tb 50 5/1m0s:8 100/1h0m0s")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Limits[0], (Limit{Rate: 5, Period: time.Minute, Burst: 8}); got != want {
		t.Errorf("limit 0 = %+v; want %+v", got, want)
	}
	if got, want := r.String(), "1 tb 50 5/1m0s:8 100/1h0m0s"; got != want {
		t.Errorf("String() = %q; want %q", got, want)
	}
	for _, text := range []string{"", "1 sw", "2 sw 50 1/1s", "1 xx 50 1/1s", "1 sw 0 1/1s", "1 sw 50 1/x"} {
		if _, err := ParseRecord(text); err == nil {
			t.Errorf("ParseRecord(%q) succeeded", text)
		}
	}
}
