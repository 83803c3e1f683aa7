package throttle

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"weak"

	"github.com/redis/go-redis/v9"
)

// What a client sees of Redis going away, as it happens: a go-redis hook on the Redis
// client (and, for a cluster, on each node's client) watches every dial and every
// connection's reads and writes. Their errors are noted at once (client.noteError),
// so that a call cut by its deadline while go-redis still retries can say why
// (lastError); and a dial that fails ends the round trips waiting for a connection to
// its address (see trip), which go-redis would otherwise go on retrying for seconds
// (five dials 100ms apart per try, four tries, by default). go-redis dials on a
// goroutine of its own, under a context of its own: the hook finds the round trips
// through the client, by address.

// watchHook is the hook; rdb is the Redis client it reports to (a cluster's, for its
// nodes).
type watchHook struct{ rdb redis.UniversalClient }

func (h watchHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h watchHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h watchHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			if c := h.client(); c != nil {
				c.noteError(err)
				c.dialFailed(addr, err)
			}
			return conn, err
		}
		if sc, ok := conn.(syscall.Conn); ok { // go-redis peeks at idle connections through it
			return &syscallWatchedConn{watchedConn: watchedConn{Conn: conn, h: h}, sc: sc}, nil
		}
		return &watchedConn{Conn: conn, h: h}, nil
	}
}

// client returns the process's client of h.rdb, or nil.
func (h watchHook) client() *client {
	clients.mu.Lock()
	defer clients.mu.Unlock()
	return clients.m[h.rdb]
}

// note hands err to the client of h.rdb, if the process has one.
func (h watchHook) note(err error) {
	if c := h.client(); c != nil {
		c.noteError(err)
	}
}

// watchedConn is a connection whose first read or write error is noted (what follows
// on a broken connection, such as EOF after a reset, says less); a deadline that
// passes (go-redis's own bound) and a read cut by go-redis closing the connection are
// no news of Redis, and are not.
type watchedConn struct {
	net.Conn
	h     watchHook
	noted atomic.Bool
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.saw(err)
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.saw(err)
	return n, err
}

func (c *watchedConn) saw(err error) {
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) && !c.noted.Swap(true) {
		c.h.note(err)
	}
}

// syscallWatchedConn is a watchedConn of a connection that go-redis can peek at.
type syscallWatchedConn struct {
	watchedConn
	sc syscall.Conn
}

func (c *syscallWatchedConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }

// watch adds the hook to rdb once per Redis client: a plain client's own, each node's
// of a cluster (those made from now on). clients.mu held.
func watch(rdb redis.UniversalClient) {
	if clients.watched == nil {
		clients.watched = map[any]struct{}{}
	}
	switch r := rdb.(type) {
	case *redis.Client:
		if once(weak.Make(r)) {
			r.AddHook(watchHook{rdb})
		}
	case *redis.ClusterClient:
		if once(weak.Make(r)) {
			r.OnNewNode(func(node *redis.Client) { node.AddHook(watchHook{rdb}) })
		}
	}
}

// once reports whether wp is watched for the first time, and forgets it when its
// client is collected. clients.mu held.
func once[T any](wp weak.Pointer[T]) bool {
	if _, ok := clients.watched[wp]; ok {
		return false
	}
	clients.watched[wp] = struct{}{}
	runtime.AddCleanup(wp.Value(), func(wp weak.Pointer[T]) {
		clients.mu.Lock()
		delete(clients.watched, wp)
		clients.mu.Unlock()
	}, wp)
	return true
}

// failsFast reports whether a failed dial ends a round trip of rdb: not for a
// Sentinel-backed client, whose next dial may find the new master, nor a ring.
func failsFast(rdb redis.UniversalClient) bool {
	switch r := rdb.(type) {
	case *redis.Client:
		return r.Options().Addr != "FailoverClient" // how go-redis names a FailoverClient's address
	case *redis.ClusterClient:
		return true
	}
	return false
}

// trip is a round trip's (on a cluster, one key's part of it) hold on its context,
// registered with its client while it runs: a dial to its address that fails ends it
// at once, when the client fails fast, and the dial's error is what its calls get.
type trip struct {
	c      *client
	addr   string // where it goes: a cluster node's address; "" for a client of one
	cancel context.CancelFunc
	err    errorOnce
}

// startTrip registers a trip of ctx to addr with c; its end unregisters it.
func (c *client) startTrip(ctx context.Context, addr string) (context.Context, *trip) {
	ctx, cancel := context.WithCancel(ctx)
	t := &trip{c: c, addr: addr, cancel: cancel}
	if c.fast {
		c.mu.Lock()
		if c.trips == nil {
			c.trips = map[*trip]struct{}{}
		}
		c.trips[t] = struct{}{}
		c.mu.Unlock()
	}
	return ctx, t
}

// end unregisters t and releases its context.
func (t *trip) end() {
	if t.c.fast {
		t.c.mu.Lock()
		delete(t.c.trips, t)
		t.c.mu.Unlock()
	}
	t.cancel()
}

// dialFailed ends, with err, the round trips to addr under way.
func (c *client) dialFailed(addr string, err error) {
	if !c.fast {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for t := range c.trips {
		if (t.addr == "" || t.addr == addr) && t.err.set(err) {
			t.cancel()
		}
	}
}

// tripAddr returns where a round trip of the key whose hash tag is tag goes: its
// master's address on a cluster (as the client's slot map has it now), else "".
func (c *client) tripAddr(ctx context.Context, tag string) string {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	m, err := cc.MasterForKey(ctx, tag)
	if err != nil {
		return "?" // no master known: no dial of its own to fail
	}
	return m.Options().Addr
}

// errorOnce holds the first error set.
type errorOnce struct{ p atomic.Pointer[error] }

// set stores err if none was; it reports whether it did.
func (e *errorOnce) set(err error) bool { return e.p.CompareAndSwap(nil, &err) }

// get returns the error set, or nil.
func (e *errorOnce) get() error {
	if p := e.p.Load(); p != nil {
		return *p
	}
	return nil
}
