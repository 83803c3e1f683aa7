package redistest

import (
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
)

// commandClock keeps a real-time miniredis's clock still while one command runs, as
// Redis keeps it still while a script runs.
//
// miniredis's ClockTTL checks expiry on every command, including each redis.call of
// a script, against the wall clock: under load a key could expire between two reads
// of one script (a log read whole by its first LRANGE and gone at its second, seen as
// JTSTATE "length" or "last time"), which Redis never does. So a hook sets the clock
// (SetTime) to the real time as each command from a client starts, and never while
// a script's own commands run: those find miniredis's lock held by the script and
// leave the clock where it is. A command that starts while another client's command
// holds the lock leaves it too, and runs on a clock at most as old as the latest
// command's start. The clock never goes back.
type commandClock struct {
	m    *miniredis.Miniredis
	mu   sync.Mutex
	last time.Time
}

// hook is the miniredis pre-hook: it never answers the command itself.
func (c *commandClock) hook(_ *server.Peer, cmd string, _ ...string) bool {
	switch cmd {
	case "EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "EXEC":
		// never a script's own command: set the clock the script will read
	default:
		if !c.m.TryLock() {
			return false // inside a script, or behind another client's command
		}
		c.m.Unlock()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.After(c.last) {
		c.last = now
	}
	c.m.SetTime(c.last)
	return false
}

// SetError makes the miniredis backend answer every command with the error msg, or
// answer normally again for "", as miniredis's SetError does; on a real-time backend
// it keeps the backend's clock hook (see NewMiniRealTime), which miniredis's own
// SetError would remove, stopping its clock. Use it, not b.Mini.SetError.
func (b *Backend) SetError(msg string) {
	if b.clock == nil {
		b.Mini.SetError(msg)
		return
	}
	if msg == "" {
		b.Mini.Server().SetPreHook(b.clock.hook)
		return
	}
	b.Mini.Server().SetPreHook(func(p *server.Peer, _ string, _ ...string) bool {
		p.WriteError(msg)
		return true
	})
}
