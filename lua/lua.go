// Package lua holds jobthrottle's Redis scripts, one per algorithm.
//
// Each *.lua file opens with its contract: KEYS, ARGV, the reply and what it writes.
// The scripts share helpers: prelude.lua (clock, argument checks, pause) goes in front
// of every script, controlwrite.lua (writing the control key) after it in pause.lua's
// and control.lua's, log.lua (the permit log) in front of the two log-based ones and
// their inspect scripts (with inspectlog.lua), tbstate.lua and fwstate.lua (reading
// the token bucket's and the fixed window's state) in front of theirs. A script makes
// every function it defines anew on each run, so each takes only the helpers it uses.
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
	//go:embed fixedwindow.lua
	fixedWindowSrc string
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
	//go:embed tbstate.lua
	tbState string
	//go:embed fwstate.lua
	fwState string
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

// The full text of each script as it is sent to Redis (helpers included).
var (
	SlidingWindowSource  = batchable(prelude+logEngine, slidingWindowSrc)
	SlidingCounterSource = batchable(prelude+logEngine, slidingCounterSrc)
	GCRASource           = batchable(prelude+tbState, gcraSrc)
	FixedWindowSource    = batchable(prelude+fwState, fixedWindowSrc)
	PauseSource          = prelude + controlWrite + pauseSrc
	ControlSource        = prelude + controlWrite + controlSrc
	SemaphoreSource      = prelude + semaphoreSrc

	InspectSlidingWindowSource  = prelude + logEngine + inspectLog + inspectSWSrc
	InspectSlidingCounterSource = prelude + logEngine + inspectLog + inspectSCSrc
	InspectGCRASource           = prelude + tbState + inspectTBSrc
	InspectFixedWindowSource    = prelude + fwState + inspectFWSrc
	InspectSemaphoreSource      = prelude + inspectSemSrc
)

// batchable returns a limiter script that takes a batch of requests as well as a
// single one: its body (src) becomes the function jt_one, which batch.lua's driver
// runs once for a single call, or once per request of a batch.
func batchable(helpers, src string) string {
	return helpers + "local function jt_one()\n" + src + "\nend\n" + batchSrc
}

// Batch is ARGV[1] of a limiter script's batch form (see batch.lua).
const Batch = 4

var (
	// SlidingWindow is the permit-log script; its contract is the header of slidingwindow.lua.
	SlidingWindow = redis.NewScript(SlidingWindowSource)
	// SlidingCounter is the sub-bucket counter script; see slidingcounter.lua.
	SlidingCounter = redis.NewScript(SlidingCounterSource)
	// GCRA is the token-bucket script; see gcra.lua.
	GCRA = redis.NewScript(GCRASource)
	// FixedWindow is the aligned-window counter script; see fixedwindow.lua.
	FixedWindow = redis.NewScript(FixedWindowSource)
	// Pause is the script that stops grants on a key for a while; see pause.lua.
	Pause = redis.NewScript(PauseSource)
	// Control sets or clears an operator's override of a key's rates, or ends its
	// pause; see control.lua.
	Control = redis.NewScript(ControlSource)
	// Semaphore is the in-flight limit script (leases and their queue); see semaphore.lua.
	Semaphore = redis.NewScript(SemaphoreSource)

	// InspectSlidingWindow reads a sliding window's live state, writing nothing; see
	// inspect_sw.lua.
	InspectSlidingWindow = redis.NewScript(InspectSlidingWindowSource)
	// InspectSlidingCounter reads a sliding counter's live state; see inspect_sc.lua.
	InspectSlidingCounter = redis.NewScript(InspectSlidingCounterSource)
	// InspectGCRA reads a token bucket's live state; see inspect_tb.lua.
	InspectGCRA = redis.NewScript(InspectGCRASource)
	// InspectFixedWindow reads a fixed window's live state; see inspect_fw.lua.
	InspectFixedWindow = redis.NewScript(InspectFixedWindowSource)
	// InspectSemaphore reads a semaphore's live state; see inspect_sem.lua.
	InspectSemaphore = redis.NewScript(InspectSemaphoreSource)
)
