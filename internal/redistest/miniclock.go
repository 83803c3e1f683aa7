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

// SetError makes the miniredis backend refuse commands with the error msg, as Redis
// refuses them while it loads its data or when an ACL denies them; "" ends it. As in
// Redis, a transaction's frame is not refused: the commands queued in it are, and its
// EXEC answers EXECABORT. (miniredis's own SetError refuses MULTI too, which Redis
// does not, and go-redis, finding MULTI refused, leaves the rest of that round trip's
// replies unread on the connection, where the next round trip reads them as its own.)
// A transaction's fate is decided by the error standing at its MULTI. SetError keeps
// a real-time backend's clock hook (see NewMiniRealTime), which miniredis's own
// SetError would remove. Use it, not b.Mini.SetError.
func (b *Backend) SetError(msg string) {
	if b.refusal == nil {
		b.refusal = &refusal{tx: map[*server.Peer]string{}, next: b.clock}
		b.Mini.Server().SetPreHook(b.refusal.hook)
	}
	b.refusal.mu.Lock()
	b.refusal.msg = msg
	b.refusal.mu.Unlock()
}

// refusal is the pre-hook of SetError.
type refusal struct {
	mu  sync.Mutex
	msg string
	// tx holds the peers inside a transaction: the error that stood at its MULTI
	// ("" for one miniredis runs).
	tx   map[*server.Peer]string
	next *commandClock // the real-time backend's clock hook, or nil
}

func (r *refusal) hook(p *server.Peer, cmd string, args ...string) bool {
	r.mu.Lock()
	msg, inTx := r.tx[p]
	switch {
	case !inTx && cmd == "MULTI":
		msg = r.msg
		r.tx[p] = msg
		if msg != "" {
			p.WriteOK()
		}
	case inTx && (cmd == "EXEC" || cmd == "DISCARD"):
		delete(r.tx, p)
		switch {
		case msg == "":
		case cmd == "EXEC":
			p.WriteError("EXECABORT Transaction discarded because of previous errors.")
		default:
			p.WriteOK()
		}
	default:
		if !inTx {
			msg = r.msg
		}
		if msg != "" {
			p.WriteError(msg)
		}
	}
	r.mu.Unlock()
	if msg != "" {
		return true
	}
	if r.next != nil {
		return r.next.hook(p, cmd, args...)
	}
	return false
}
