// Package lua holds jobthrottle's Redis scripts, one per algorithm.
//
// Each *.lua file opens with its contract: KEYS, ARGV, the reply and what it writes.
// The scripts share helpers: prelude.lua (clock, argument checks, pause) goes in front
// of every script, controlwrite.lua (writing the control key) after it in pause.lua's
// and control.lua's, log.lua (the permit log) in front of the two log-based ones and
// their inspect scripts (with inspectlog.lua), tbstate.lua and fwstate.lua (reading
// the token bucket's and the fixed window's state) in front of theirs, inspect.lua
// (the inspect scripts' reply) in front of the four limiters' inspect scripts.
// gcra.lua and fixedwindow.lua hold only what their algorithms do differently;
// decide.lua, after each, is the body they share. A script makes every function it
// defines anew on each run, so each takes only the helpers it uses.
// A limiter script may start with a fast path (fast.lua and *_fast.lua): its usual call decided
// straight through, before the helpers are made, exactly as the full script after it
// would decide it; anything else runs on into the full script.
// The inspect_* scripts read a key's live state and write nothing. Every limiter script also takes
// a batch of requests in one call (batch.lua goes after its body, which it runs once per
// request).
//
// Package throttle runs the scripts that decide or write through one call
// (throttle/exec.go): EVALSHA inside MULTI/EXEC, EVAL the same way when the server has
// lost the script (after SCRIPT FLUSH or a restart), so a call whose reply is lost is
// not re-sent and runs at most once. Script.Run would do the EVALSHA/EVAL part, but
// go-redis re-sends a plain command whose reply was lost; the inspect scripts, which
// write nothing, run with it.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed prelude.lua
	prelude string
	//go:embed log.lua
	logEngine string
	//go:embed slidingwindow.lua
	slidingWindowSrc string
	//go:embed slidingcounter.lua
	slidingCounterSrc string
	//go:embed gcra.lua
	gcraSrc string
	//go:embed gcra_fast.lua
	gcraFast string
	//go:embed fixedwindow_fast.lua
	fixedWindowFast string
	//go:embed fast.lua
	fastArgs string
	//go:embed faststring.lua
	fastString string
	//go:embed log_fast.lua
	logFast string
	//go:embed slidingwindow_fast.lua
	slidingWindowFast string
	//go:embed slidingcounter_fast.lua
	slidingCounterFast string
	//go:embed fixedwindow.lua
	fixedWindowSrc string
	//go:embed decide.lua
	decideSrc string
	//go:embed batch.lua
	batchSrc string
	//go:embed pause.lua
	pauseSrc string
	//go:embed control.lua
	controlSrc string
	//go:embed controlwrite.lua
	controlWrite string
	//go:embed semaphore.lua
	semaphoreSrc string
	//go:embed semaphore_batch.lua
	semaphoreBatchSrc string
	//go:embed tbstate.lua
	tbState string
	//go:embed fwstate.lua
	fwState string
	//go:embed inspect.lua
	inspectReply string
	//go:embed inspectlog.lua
	inspectLog string
	//go:embed inspect_sw.lua
	inspectSWSrc string
	//go:embed inspect_sc.lua
	inspectSCSrc string
	//go:embed inspect_tb.lua
	inspectTBSrc string
	//go:embed inspect_fw.lua
	inspectFWSrc string
	//go:embed inspect_sem.lua
	inspectSemSrc string
)

// Name names one of the scripts. It is all the package exports of them: a Name's
// script and its text cannot be replaced by anyone who imports the package.
type Name int

// The scripts.
const (
	// SlidingWindow is the permit-log script; its contract is the header of slidingwindow.lua.
	SlidingWindow Name = iota
	// SlidingCounter is the sub-bucket counter script; see slidingcounter.lua.
	SlidingCounter
	// GCRA is the token-bucket script; see gcra.lua.
	GCRA
	// FixedWindow is the aligned-window counter script; see fixedwindow.lua.
	FixedWindow
	// Pause is the script that stops grants on a key for a while; see pause.lua.
	Pause
	// Control sets or clears an operator's override of a key's rates, or ends its
	// pause; see control.lua.
	Control
	// Semaphore is the in-flight limit script (leases and their queue); see semaphore.lua,
	// and semaphore_batch.lua for its batch form.
	Semaphore
	// InspectSlidingWindow reads a sliding window's live state, writing nothing; see
	// inspect_sw.lua.
	InspectSlidingWindow
	// InspectSlidingCounter reads a sliding counter's live state; see inspect_sc.lua.
	InspectSlidingCounter
	// InspectGCRA reads a token bucket's live state; see inspect_tb.lua.
	InspectGCRA
	// InspectFixedWindow reads a fixed window's live state; see inspect_fw.lua.
	InspectFixedWindow
	// InspectSemaphore reads a semaphore's live state; see inspect_sem.lua.
	InspectSemaphore
	numNames
)

// texts is the full text of each script as it is sent to Redis (helpers included):
// its fast path, if it has one, then the full script.
var texts = func() (t [numNames]string) {
	for i, src := range full {
		t[i] = fast[i] + src
	}
	return t
}()

// fast holds the scripts' fast paths (*_fast.lua): the usual call decided before the
// full script's helpers are made; anything else runs on into the full script.
var fast = [numNames]string{
	SlidingWindow:  fastArgs + slidingWindowFast + logFast,
	SlidingCounter: fastArgs + slidingCounterFast + logFast,
	GCRA:           fastArgs + fastString + gcraFast,
	FixedWindow:    fastArgs + fastString + fixedWindowFast,
}

// full is each script without its fast path.
var full = [numNames]string{
	SlidingWindow:  batchable(prelude+logEngine, slidingWindowSrc),
	SlidingCounter: batchable(prelude+logEngine, slidingCounterSrc),
	GCRA:           batchable(prelude+tbState+gcraSrc, decideSrc),
	FixedWindow:    batchable(prelude+fwState+fixedWindowSrc, decideSrc),
	Pause:          prelude + controlWrite + pauseSrc,
	Control:        prelude + controlWrite + controlSrc,
	Semaphore:      prelude + "local function jt_one()\n" + semaphoreSrc + "\nend\n" + semaphoreBatchSrc,

	InspectSlidingWindow:  prelude + logEngine + inspectReply + inspectLog + inspectSWSrc,
	InspectSlidingCounter: prelude + logEngine + inspectReply + inspectLog + inspectSCSrc,
	InspectGCRA:           prelude + tbState + inspectReply + inspectTBSrc,
	InspectFixedWindow:    prelude + fwState + inspectReply + inspectFWSrc,
	InspectSemaphore:      prelude + inspectSemSrc,
}

// byName holds each script made once from its source (its SHA computed once).
var byName = func() (s [numNames]*redis.Script) {
	for i, src := range texts {
		s[i] = redis.NewScript(src)
	}
	return s
}()

// Script returns the script n names, to run (see the package doc for how).
func (n Name) Script() *redis.Script { return byName[n] }

// Source returns the full text of the script n names as it is sent to Redis, helpers
// included.
func (n Name) Source() string { return texts[n] }

// batchable returns a limiter script that takes a batch of requests as well as a
// single one: its body (src) becomes the function jt_one, which batch.lua's driver
// runs once for a single call, or once per request of a batch.
func batchable(helpers, src string) string {
	return helpers + "local function jt_one()\n" + src + "\nend\n" + batchSrc
}

// Batch is ARGV[1] of a limiter script's batch form (see batch.lua).
const Batch = 4
