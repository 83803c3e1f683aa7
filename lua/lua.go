// Package lua holds jobthrottle's Redis scripts, one per algorithm.
//
// Each *.lua file opens with its contract: KEYS, ARGV, the reply and what it writes.
// The scripts share helpers: prelude.lua (clock, argument checks, pause) goes in front
// of every script, and log.lua (the permit log) in front of the two log-based ones.
// Package throttle runs every one of them through one call (throttle/exec.go): EVALSHA
// inside MULTI/EXEC, EVAL the same way when the server has lost the script (after
// SCRIPT FLUSH or a restart), so a call whose reply is lost is not re-sent and runs at
// most once. Script.Run would do the EVALSHA/EVAL part, but go-redis re-sends a plain
// command whose reply was lost.
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
	//go:embed pause.lua
	pauseSrc string
	//go:embed semaphore.lua
	semaphoreSrc string
)

// The full text of each script as it is sent to Redis (helpers included).
var (
	SlidingWindowSource  = prelude + logEngine + slidingWindowSrc
	SlidingCounterSource = prelude + logEngine + slidingCounterSrc
	GCRASource           = prelude + gcraSrc
	FixedWindowSource    = prelude + fixedWindowSrc
	PauseSource          = prelude + pauseSrc
	SemaphoreSource      = prelude + semaphoreSrc
)

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
	// Semaphore is the in-flight limit script (leases and their queue); see semaphore.lua.
	Semaphore = redis.NewScript(SemaphoreSource)
)
