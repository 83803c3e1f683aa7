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
		{"{jobthrottle:vendor-api}:l", "vendor-api", "l", true},
		{"{jobthrottle:vendor-api}:q", "vendor-api", "q", true},
		{"{jobthrottle:vendor-api}:t:acme", "vendor-api", "t:acme", true},
		{"{jobthrottle:mail}:bk:task-1", "mail", "bk:task-1", true},
		{"{jobthrottle:mail}:bk:a}:l", "mail", "bk:a}:l", true}, // a booking's id may hold "}:"
		{"{jobthrottle:a}:l}:q", "a}:l", "q", true},             // so may a key
		{"{jobthrottle:vendor-api}:other", "", "", false},       // not a suffix of ours
		{"{jobthrottle:vendor-api}:bk:", "", "", false},         // a booking without an id
		{"{jobthrottle:vendor-api}:t:", "", "", false},          // a tenant without a name
		{"{other:vendor-api}:l", "", "", false},                 // another prefix
		{"jobthrottle:vendor-api:l", "", "", false},             // no tag
		{"{jobthrottle:}:l", "", "", false},                     // an empty key
		{"{jobthrottle:vendor-api}:l:x", "", "", false},         // more after the suffix
		{"{jobthrottle:vendor-api}", "", "", false},             // no suffix
		{"{jobthrottle:reports}:sem", "reports", "sem", true},   // a semaphore's leases
		{"{jobthrottle:vendor-api}:sw", "", "", false},          // an older release's state
	} {
		key, suffix, ok := Split("jobthrottle:", c.name)
		if key != c.key || suffix != c.suffix || ok != c.ok {
			t.Errorf("Split(%q) = %q, %q, %v; want %q, %q, %v", c.name, key, suffix, ok, c.key, c.suffix, c.ok)
		}
	}
}

// A head reads back as written, for every algorithm; anything else is refused.
func TestHead(t *testing.T) {
	for _, text := range []string{"sw 20 1000000", "sc 50 100 60000000 5 1000000", "tb 10 1000000 20", "fw 3 1000000 100 60000000"} {
		h, err := ParseHead(text)
		if err != nil {
			t.Fatalf("ParseHead(%q): %v", text, err)
		}
		if got := h.String(); got != text {
			t.Errorf("ParseHead(%q).String() = %q", text, got)
		}
	}
	h, _ := ParseHead("tb 10 1000000 20")
	if want := (Limit{Rate: 10, Period: time.Second, Burst: 20}); h.Alg != TokenBucket || len(h.Limits) != 1 || h.Limits[0] != want {
		t.Errorf("ParseHead = %+v", h)
	}
	for _, text := range []string{"", "xx 1 2", "sw", "sw 1", "sw 1 2 3", "tb 1 2", "sc 1 2", "sw 0 1000", "sw 1 -5", "sw 1.5 2", "sc x 1 2"} {
		if _, err := ParseHead(text); err == nil {
			t.Errorf("ParseHead(%q): no error", text)
		}
	}
}

// ParseMeta reads what the scripts write (texts copied from real keys): the head, a
// pause, an override, the fair share's clock and operators' weights, a tenant's name
// holding a newline among them.
func TestParseMeta(t *testing.T) {
	m, err := ParseMeta("sw 20 1000000\np 1796586025476357\no 1796586325476357 1796586025476357 5 0\nf 21818.5 2000000 1796586018303794 400000\nw 1796589018303794 3000000 6 a\nb cd\nw 1796589018303794 500000 2 zz")
	if err != nil {
		t.Fatal(err)
	}
	if m.Head != "sw 20 1000000" || m.PauseEnd != 1796586025476357 || m.Override == nil || m.Override.Rates[0] != (Rate{5, 0}) ||
		m.Override.End != 1796586325476357 || m.Fair == nil || m.Fair.V != 21818.5 || m.Fair.W != 2000000 ||
		len(m.Weights) != 2 || m.Weights[0] != (Weight{"a\nb cd", 3000000, 1796589018303794}) || m.Weights[1].Tenant != "zz" {
		t.Fatalf("ParseMeta = %+v (override %+v, fair %+v)", m, m.Override, m.Fair)
	}
	for _, text := range []string{"hello", "sw 20 1000000\nx 1", "sw 20 1000000\np", "sw 20 1000000\nw 1 2 99 ab", "sw 20 1000000\nf 1 2 3"} {
		if _, err := ParseMeta(text); err == nil {
			t.Errorf("ParseMeta(%q): no error", text)
		}
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
		{"l", "list", []string{"sw 20 1000000", "0", "1795795049994989", "3", "1795795050994989", "13"}, ""},
		{"l", "list", []string{"sw 20 1000000\np 1796586025476357"}, ""}, // a meta alone
		{"l", "list", []string{"sw 20 1000000", "hello"}, `element 1 "hello"`},
		{"l", "list", []string{"sw 20 1000000", "-1"}, `element 1 "-1"`},
		{"l", "list", []string{"tb 1 2 3", "0"}, "not a log's"},
		{"l", "list", []string{"0", "1"}, `head "0"`},
		{"l", "hash", nil, "a hash, not a list or string"},
		{"l", "string", []string{"1795795049994989 3000000 0\ntb 5 1000000 5"}, ""},
		{"l", "string", []string{"1795795049994989 -12000000 1795795052394989\ntb 5 1000000 5"}, ""},                                                              // booked ahead
		{"u:tokens", "string", []string{"1795795049994989 3000000 0 r 160 1795795049000000 1795795049500000 1 1795795049600000 163\ntb /tokens 5 1000000 5"}, ""}, // a unit's refunds
		{"u:tokens", "string", []string{"1795795049994989 3000000 0 r 160 1795795049000000 1795795049500000\ntb /tokens 5 1000000 5"}, "not a bucket's notes"},
		{"u:tokens", "string", []string{"1795795049994989 3000000 0 r -1 1795795049000000\ntb /tokens 5 1000000 5"}, "not a bucket's notes"},
		{"l", "string", []string{"1795795049994989 4\nfw 5 1000000"}, ""},
		{"l", "string", []string{"\ntb 5 1000000 5\np 1796586025476357"}, ""}, // a meta alone
		{"l", "string", []string{"1795795049994989 4\nsw 5 1000000"}, "not a bucket's or a window's"},
		{"l", "string", []string{"4.5 1\nfw 5 1000000"}, `"4.5" is not a number`},
		{"l", "string", []string{"hello"}, "not a state"},
		{"t:acme", "list", []string{"sw 8 1000000", "0", "1795795049994989", "1"}, ""},
		{"bk:task-1", "string", []string{"1795795049994989 1 1795795049000000"}, ""},
		{"bk:task-1", "string", []string{"t 250000000000 1"}, ""},
		{"bk:task-1", "string", []string{"done"}, "not a booking"},
		{"bk:task-1", "list", nil, "a list, not a string"},
		{"q", "zset", []string{"1000000 acme", "400000"}, ""},
		{"q", "zset", []string{"acme", "400000"}, "not a queued tenant"},
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

func TestTag(t *testing.T) {
	if tag, err := Tag(DefaultPrefix, "vendor-api"); err != nil || tag != "{jobthrottle:vendor-api}" {
		t.Fatalf("Tag = %q, %v", tag, err)
	}
	for _, key := range []string{"", strings.Repeat("k", MaxLen)} {
		if _, err := Tag(DefaultPrefix, key); err == nil {
			t.Errorf("Tag(%q): no error", key)
		}
	}
	if _, err := Tag("", "}x"); err == nil {
		t.Error(`Tag("", "}x"): no error`)
	}
	if err := CheckTenant(strings.Repeat("t", MaxTenant+1)); err == nil {
		t.Error("CheckTenant of 257 bytes: no error")
	}
	if err := CheckTenant(""); err == nil {
		t.Error("CheckTenant of an empty name: no error")
	}
}
