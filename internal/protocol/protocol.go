// Package protocol is the one description of how throttle talks to the limiter scripts
// (lua/limiter.lua and the algorithm files): the keys a call names, its arguments, the
// requests it carries, the reply, and the codes both sides use. The Go side builds
// requests and reads replies with this package; the generator (lua/internal/gen) writes
// its constants into every generated script, so each code has one definition.
//
// # Keys
//
// Every key of a limiter lies under its hash tag, "{<prefix><key>}" (internal/keys):
//
//	KEYS[1]   {…}:l          the limiter's state: its algorithm's data and its meta (below)
//	KEYS[2..] {…}:u:<unit>   the state of each unit's limits (the head's parts), in its order
//	then      the requests' own keys, in any order, each named by its index:
//	          {…}:bk:<id>    a task's booking or ticket (a string, see Bookings)
//	          {…}:t:<name>   a tenant's state: its caps of calls, kept as the group's state is
//	          {…}:u:<unit>:<name>  its caps of each unit (CapKeys), right after it
//	          {…}:q          the fair share's queue: a sorted set of the tenants that have
//	                         requests ahead ("<weight> <name>" scored by its finish tag)
//	          {…}:st:<id>    a settle's record: "1" while a second settle must change nothing
//
// A script reads no key it is not given, and a call names only keys a request needs: a
// plain limiter's call names one key, so a Cluster slot migration moves it whole.
//
// # Units
//
// A limit counts calls (a request's n) unless the head names its unit: the limits after
// "/<unit>" count a request's cost in that unit (its u options; 0 when it names none).
// The limits of each unit are a part, decided as a limiter of its own with its own state
// (the calls' in KEYS[1], another unit's in {…}:u:<unit>, whose meta is the part's head);
// a request takes from every part at once or from none.
//
// # The state and its meta
//
// KEYS[1] and a tenant's key (and each part's) hold an algorithm's data and a meta text: the sliding
// window and counter keep a list [meta, base, T1, S1, ...]; the token bucket and the
// fixed window a string "<numbers>\n<meta>". The meta's first line is the head the
// callers send as ARGV[1] (ARGV[2] for a tenant's caps): the algorithm and its limits
// (Head). Lines after it, present only while they matter:
//
//	p <pause_end>                          a pause, µs of the server's clock
//	o <end> <set> <r1> <b1> ... <rm> <bm>  an override of limits 1..m (set: when it was set)
//	f <V> <W> <tV> <Fmax>                  the fair share's clock (see lua/limiter.lua)
//	d <at> <head>                          another process's head this one replaced (drift)
//	w <end> <weight> <len> <name>          an operator's weight for a tenant
//
// A call whose head differs from the stored one (another process with other limits)
// decides with its own, reports FlagDrift with the head it found, and notes that head
// in a d line for a minute; the head of another algorithm is ErrAlg.
//
// # Arguments
//
//	ARGV[1]    the group's head: "<alg> [<param>] <limit>..." (Head)
//	ARGV[2]    the tenants' caps' head, or "" when the limiter has none
//	ARGV[3..]  the requests, one text each, 1..MaxRequests of them
//
// A request is an op and its fields, separated by single spaces; options follow as a
// letter and a value, the tenant's name last:
//
//	a <n> <wait_us> [b<i> l<late_us>] [q<i> c<i> u<unit>:<n>... w<weight> k<ticket> h] [t<name>]   acquire
//	c <n> <token> [b<i>] [c<i>] [u<unit>:<n>...] [q<i> w<weight> k<ticket> t<name>]   cancel (token: the booking's stamp with b; k: a place given back)
//	s <n> <token> e<i> u<unit>:<estimate>:<actual>... [q<i> c<i> w<weight> t<name>]   settle
//	i [q<i> c<i> t<name>]                              inspect
//	p <len_us> [q<i>]                                  pause (q: the queue lives as long as the clock)
//	r                                                  resume
//	o <len_us> <r1> <b1> [<r2> <b2> ...]               override (len 0: until cleared)
//	x                                                  clear the override
//	W <len_us> <weight> q<i> t<name>                   a tenant's weight, fleet-wide (len 0: clear)
//
// Numbers are decimal integers in range; a weight is a decimal number in (0, MaxWeight].
// An acquire of n = 0 takes nothing. b names a task's booking key, q the fair share's
// key, c the tenant's state key (the limiter has caps), w the caller's weight, k a
// ticket the caller holds, h that the caller takes a place (a ticket) when its turn has
// not come and it may wait for it (a task, or a wait of no more than its max wait); a
// cancel with k gives a place back (its token is 0). A settle charges a grant of n and the estimates at token (the acquire's
// reply's) the actual's difference in each unit, at the grant's place, once per record
// key e. Requests are decided in order at one server instant, each as a call of its
// own at that instant would be.
//
// # Reply
//
// One flat array of integers: Width per request, then an extra region. Fields:
//
//	acquire  status, remaining, wait_us, reset_us, token, stamp, flags
//	cancel   freed 0|1, 0, 0, reset_us, the booking's token (b), 0, 0
//	settle   status, remaining, 0, reset_us, token, 0, 0   (1 applied, 2 applied before, 3 too late)
//	inspect  1, remaining, next_us, reset_us, at, len, flags   (extra[at..]: Inspect's detail, below)
//	control  1, 0, paused_us, override_us, ended, 0, 0         (ended: a resume's pause end)
//	error    -1, code, at, len, 0, 0, 0                        (extra[at..]: its text's bytes)
//
// An inspect's detail starts booked, ahead_us, paused_us, pttl_ms, override_us, pause_end
// (the pause's end in server µs, 0 when the key is not paused: what a process that may
// have missed a pause's notice compares its bookings' tokens with), then rate, capacity,
// available per limit; the rest is lua/limiter.lua's inspect's.
//
// A call that found another process's head in the state ends its reply with that head:
// its bytes, one an integer, then their count (the requests it decided say FlagDrift).
//
// status: 0 denied, 1 granted, 2 a task's booking found. wait_us: granted, until the
// permits take effect; denied, until asking again can succeed (n fits, or the tenant's
// turn comes). token: when a grant takes effect, µs. stamp: a task's booking's stamp, or
// with FlagTicket a ticket, the caller's place in its tenant's queue. flags: which limit
// denied, and FlagDrift. at is 1-based in the whole reply.
package protocol

import "strconv"

// Width is how many integers answer one request.
const Width = 7

// The ops: a request's first token.
const (
	OpAcquire  = "a"
	OpCancel   = "c"
	OpInspect  = "i"
	OpPause    = "p"
	OpResume   = "r"
	OpOverride = "o"
	OpClear    = "x"
	OpWeight   = "W"
	OpSettle   = "s"
)

// A request's error, the reply's second field when its first is -1. The text that
// follows is for people: codes are matched by value.
const (
	ErrArg     = 1 // an argument is missing or out of range
	ErrState   = 2 // a key holds what jobthrottle did not write (another type, or text not ours)
	ErrAlg     = 3 // the key holds another algorithm's state; the text starts with its head's tag
	ErrExceeds = 4 // n is above what the limits in force can ever grant
)

// Flags of an acquire's or inspect's reply.
const (
	FlagGroup  = 1  // a limit of the group denied (or put the grant beyond the tenants' horizon)
	FlagCap    = 2  // a cap of the tenant denied (or put the grant beyond the horizon)
	FlagTurn   = 4  // the tenant's fair turn has not come
	FlagPaused = 8  // the key is paused
	FlagDrift  = 16 // the key's head was another process's: other limits on the same key
	FlagTicket = 32 // stamp is a ticket: the caller's place, to send back with k
)

// A settle's status, the reply's first field.
const (
	SettleApplied  = 1 // the difference was charged
	SettleRepeated = 2 // the record says it was before: nothing changed
	SettleTooLate  = 3 // the grant counts in no limit any more: nothing changed
)

// Bounds the scripts check.
const (
	MaxRequests = 1000
	MaxLimits   = 16
	MaxRate     = 1000000000 // rates, bursts
	MaxPeriod   = 1 << 45    // µs: periods, pauses, overrides (about 407 days)
	MaxTicks    = 1 << 50    // burst × period
	MaxWait     = 1<<53 - 1  // µs: waits, tokens, stamps
	MaxWeight   = 1000000    // a tenant's weight
	MinWeight   = 0.000001   // a tenant's weight
	MaxTenant   = 256        // bytes of a tenant's name
	MaxUnit     = 32         // bytes of a unit's name
	// Horizon is the least time ahead a tenant's request may book (the scripts take two
	// of the group's slots when that is longer): further ahead, it is told when to ask
	// again, so no tenant's backlog books the key far ahead of another's next request.
	Horizon = 250000
)

// Constants returns the constants a script uses, by their Lua names, as the generator
// writes them.
func Constants() [][2]string {
	str := func(s string) string { return "'" + s + "'" }
	return [][2]string{
		{"OP_ACQUIRE", str(OpAcquire)}, {"OP_CANCEL", str(OpCancel)}, {"OP_INSPECT", str(OpInspect)},
		{"OP_PAUSE", str(OpPause)}, {"OP_RESUME", str(OpResume)}, {"OP_OVERRIDE", str(OpOverride)},
		{"OP_CLEAR", str(OpClear)}, {"OP_WEIGHT", str(OpWeight)}, {"OP_SETTLE", str(OpSettle)},
		{"E_ARG", itoa(ErrArg)}, {"E_STATE", itoa(ErrState)}, {"E_ALG", itoa(ErrAlg)}, {"E_EXCEEDS", itoa(ErrExceeds)},
		{"F_GROUP", itoa(FlagGroup)}, {"F_CAP", itoa(FlagCap)}, {"F_TURN", itoa(FlagTurn)},
		{"F_PAUSED", itoa(FlagPaused)}, {"F_DRIFT", itoa(FlagDrift)}, {"F_TICKET", itoa(FlagTicket)},
		{"MAX_REQUESTS", itoa(MaxRequests)}, {"MAX_LIMITS", itoa(MaxLimits)}, {"MAX_RATE", itoa(MaxRate)},
		{"MAX_PERIOD", itoa(MaxPeriod)}, {"MAX_TICKS", itoa(MaxTicks)}, {"MAX_WAIT", itoa(MaxWait)},
		{"MAX_WEIGHT", itoa(MaxWeight)}, {"MAX_TENANT", itoa(MaxTenant)}, {"MAX_UNIT", itoa(MaxUnit)}, {"HORIZON", itoa(Horizon)},
		{"WIDTH", itoa(Width)},
	}
}

func itoa(v int64) string {
	if v == 0 {
		return "0"
	}
	var b [24]byte
	i := len(b)
	for ; v > 0; v /= 10 {
		i--
		b[i] = byte('0' + v%10)
	}
	return string(b[i:])
}

// Request is one request of a limiter call, as throttle makes it. Keys are names: Append
// writes each as its index in the call's KEYS.
type Request struct {
	Op      string
	N       int
	X       int64  // acquire: max wait µs; cancel: the token (with Booking, the stamp); pause, override, weight: length µs
	Booking string // b: a task's booking key
	Late    int64  // l: how long after its time a task's booking may still be used, µs
	Queue   string // q: the fair share's key
	Caps    string // c: the tenant's state key
	Units   int64  // w: the tenant's weight in millionths (the weight op: the weight set)
	Ticket  int64  // k: the place the caller holds, as a reply gave it
	Hold    bool   // h: take a place when the turn has not come
	Tenant  string // t: the tenant's name
	Rates   []int  // the override's rate and burst pairs
	Costs   []Cost // u: the costs in units other than calls, in the order sent (a task's record keeps it)
	Record  string // e: a settle's record key
	// CapKeys are the keys of the caps' parts of other units than calls ({…}:u:<unit>:<name>),
	// in the caps head's order: they follow Caps in KEYS, named by no option.
	CapKeys []string
}

// Cost is a request's cost in a unit: N (an acquire's, a cancel's; a settle's estimate)
// and a settle's Actual.
type Cost struct {
	Unit      string
	N, Actual int
}

// Append appends r's text to b, each key as index(key).
func (r *Request) Append(b []byte, index func(key string) int) []byte {
	b = append(b, r.Op...)
	num := func(v int64) { b = strconv.AppendInt(append(b, ' '), v, 10) }
	opt := func(o byte, v int64) { b = strconv.AppendInt(append(b, ' ', o), v, 10) }
	switch r.Op {
	case OpAcquire, OpCancel, OpSettle:
		num(int64(r.N))
		num(r.X)
	case OpPause:
		num(r.X)
	case OpOverride:
		num(r.X)
		for _, v := range r.Rates {
			num(int64(v))
		}
	case OpWeight:
		num(r.X)
		num(r.Units)
	}
	if r.Booking != "" {
		opt('b', int64(index(r.Booking)))
		opt('l', r.Late)
	}
	if r.Queue != "" {
		opt('q', int64(index(r.Queue)))
	}
	if r.Caps != "" {
		opt('c', int64(index(r.Caps)))
		for _, k := range r.CapKeys {
			index(k)
		}
	}
	if r.Record != "" {
		opt('e', int64(index(r.Record)))
	}
	for _, c := range r.Costs {
		b = append(append(append(b, " u"...), c.Unit...), ':')
		b = strconv.AppendInt(b, int64(c.N), 10)
		if r.Op == OpSettle {
			b = strconv.AppendInt(append(b, ':'), int64(c.Actual), 10)
		}
	}
	if r.Units != 0 && r.Op != OpWeight {
		opt('w', r.Units)
	}
	if r.Ticket != 0 {
		opt('k', r.Ticket)
	}
	if r.Hold {
		b = append(b, " h"...)
	}
	if r.Tenant != "" {
		b = append(append(b, " t"...), r.Tenant...)
	}
	return b
}
