package throttle

import (
	"fmt"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// Several keys in one script call. A round trip of a client of one server carries
// the script calls of many keys (per-tenant limits: one or two requests per key); each
// call of its own costs Redis its command's dispatch, its script's set-up and its
// reply, and the client a command to build and read. So the groups of a round trip
// that run one script go in ONE call of its multi form (lua/multi.lua), which runs the
// script on each group's KEYS and ARGV in turn, exactly as the group's own call would
// (the same replies, writes and errors), each in a pcall: one key's error (WRONGTYPE,
// JTARG, JTALG) fails that key's requests alone, and the others' grants stand and are
// reported. The call goes in the round trip's transaction (MULTI/EXEC, or the
// pipeline of a client that never re-sends) as each group's call did: a lost reply
// fails each request with ErrUnavailable and what it granted stands once; NOSCRIPT
// sends it again by EVAL, as any call. Each group keeps its key's breaker (a group
// whose breaker is open is not sent), record write, hooks and failure policy.
//
// Only a client of one server (*redis.Client, standalone or failover) does this: a
// cluster's transaction keeps to one hash slot, and a Ring sends a command to the
// shard of its first key, so on those each group keeps its own call.

// multiCap is the most groups one multi-form call carries; more of one script in a
// round trip go in another.
const multiCap = 128

// multiForms maps each script that has a multi form to it (the package's tests add
// their fake-clock copies when the package starts; read-only after).
var multiForms = func() map[*redis.Script]*redis.Script {
	m := map[*redis.Script]*redis.Script{}
	for _, n := range []lua.Name{lua.SlidingWindow, lua.SlidingCounter, lua.GCRA, lua.FixedWindow, lua.Semaphore} {
		m[n.Script()] = n.Multi()
	}
	return m
}()

// multiKeys reports whether rdb's round trips may put several keys' calls in one
// multi-form call: a client of one server.
func multiKeys(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.Client)
	return ok
}

// combine returns the script calls of a round trip of groups live, in the order each
// first appears: on a client of one server, the groups of one script that has a multi
// form go in one call, carried by the first of them (its riders, itself first); every
// other group goes as it is.
func combine(rdb redis.UniversalClient, live []*group) []*group {
	if len(live) < 2 || !multiKeys(rdb) {
		return live
	}
	calls := make([]*group, 0, len(live))
	var open []*group // the last call of each script, while it has room
	for _, g := range live {
		g.riders, g.shared = nil, false
		if multiForms[g.script] == nil {
			calls = append(calls, g)
			continue
		}
		var lead *group
		for _, o := range open {
			if o.script == g.script {
				lead = o
				break
			}
		}
		if lead != nil && len(lead.riders) < multiCap {
			if lead.riders == nil {
				lead.riders = []*group{lead}
			}
			lead.riders = append(lead.riders, g)
			continue
		}
		if lead != nil {
			for i, o := range open {
				if o == lead {
					open[i] = g
				}
			}
		} else {
			open = append(open, g)
		}
		calls = append(calls, g)
	}
	return calls
}

// call returns the script call that carries g's requests (and its riders'), and the
// records that ride along (record.go): g's own call, or, with riders, its script's
// multi form on every rider's KEYS and ARGV (see lua/multi.lua).
func (g *group) call() (command, []*record) {
	if g.riders == nil {
		c := g.command()
		if c.rec == nil {
			return c, nil
		}
		return c, []*record{c.rec}
	}
	m := multiForms[g.script]
	cs := make([]command, len(g.riders))
	var recs []*record
	nk, na := 0, 0
	for i, r := range g.riders {
		cs[i] = r.command()
		nk += len(cs[i].keys)
		na += len(cs[i].args)
		if cs[i].rec != nil {
			recs = append(recs, cs[i].rec)
		}
	}
	keys := make([]string, 0, nk)
	sha := make([]any, 0, 3+nk+2+2*len(cs)+na)
	sha = append(sha, "evalsha", m.Hash(), nk)
	for _, c := range cs {
		keys = append(keys, c.keys...)
		for _, k := range c.keys {
			sha = append(sha, k)
		}
	}
	argv := len(sha)
	sha = append(sha, lua.MultiForm, len(cs))
	for _, c := range cs {
		sha = append(sha, len(c.keys), len(c.args))
	}
	for _, c := range cs {
		sha = append(sha, c.args...)
	}
	return command{script: m, keys: keys, args: sha[argv:], sha: sha, ints: true}, recs
}

// sent returns the requests g's call carries, as the round trip's context maps them
// (batchKey): its own ([]*pending), or with riders, each rider's ([][]*pending, in
// the order of the multi form's calls).
func (g *group) sent() any {
	if g.riders == nil {
		return g.reqs
	}
	all := make([][]*pending, len(g.riders))
	for i, r := range g.riders {
		all[i] = r.reqs
	}
	return all
}

// split hands each rider of g's multi-form call its share of the reply (see reply):
// its call's reply, or the error its call got; all of them the call's own error
// when it failed as a whole.
func (g *group) split() {
	if g.riders == nil {
		return
	}
	for _, r := range g.riders {
		r.shared, r.share, r.shareErr = true, nil, nil
	}
	val, err := replyOf(g.cmd), g.cmd.Err()
	if err != nil {
		for _, r := range g.riders {
			r.shareErr = err
		}
		return
	}
	flat, ok := val.([]int64)
	if !ok { // EVAL's reply, read the generic way
		s, _ := val.([]any)
		flat = make([]int64, len(s))
		if !int64s(val, flat) {
			flat = nil
		}
	}
	o := 0
	for i, r := range g.riders {
		if o+2 > len(flat) || flat[o+1] < 0 || int64(len(flat)-o-2) < flat[o+1] {
			r.shareErr = fmt.Errorf("%w: key %q: call %d of %d in one script call: cut short at %d of %d integers",
				ErrUnexpectedReply, r.src.run.key, i, len(g.riders), o, len(flat))
			continue
		}
		kind, n := flat[o], int(flat[o+1])
		part := flat[o+2 : o+2+n : o+2+n]
		o += 2 + n
		switch kind {
		case 0:
			r.share = part
		case 1:
			text := make([]byte, n)
			for j, b := range part {
				text[j] = byte(b)
			}
			r.shareErr = batchError(text)
		default: // not an array of integers: what its own call's reply would read as
			r.share = []int64{}
		}
	}
}

// reply returns the reply to g's call: its command's, or, for a rider of a
// multi-form call, its share (split).
func (g *group) reply() (any, error) {
	if g.shared {
		return g.share, g.shareErr
	}
	return replyOf(g.cmd), g.cmd.Err()
}
