package redistest

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy in front of a Redis server that can lose replies: armed with
// DropReplyTo, it forwards the next request containing a given text, lets the server
// run it, and then closes the client's connection instead of passing the reply on, as a
// network fault after the command ran would. Clients see EOF; go-redis then retries a
// plain command.
//
// It can also play a hung server (Hang: connections are accepted, requests read and
// never answered) and a slow one (Delay: requests containing a text reach the server
// only after a delay).
type Proxy struct {
	Addr    string
	target  string
	ln      net.Listener
	drop    atomic.Pointer[[]byte]
	dropped atomic.Int64
	hang    atomic.Bool
	delay   atomic.Pointer[delayRule]
	watch   atomic.Pointer[[]byte]
	mu      sync.Mutex
	conns   []net.Conn
	seen    [][]byte // requests containing watch's text
	lost    [][]byte // the replies lost, one per drop
}

// delayRule holds back requests containing text for d.
type delayRule struct {
	text []byte
	d    time.Duration
}

// NewHungServer starts a proxy that plays a Redis which accepts connections and never
// answers: it reads every request and sends nothing back.
func NewHungServer() (*Proxy, error) {
	p, err := NewProxy("")
	if err != nil {
		return nil, err
	}
	p.Hang(true)
	return p, nil
}

// Hang makes the proxy, while on, swallow every request: nothing reaches the server
// and nothing is answered, on new connections and on those already open.
func (p *Proxy) Hang(on bool) { p.hang.Store(on) }

// Delay holds back every request containing text (matched case-insensitively in the
// raw RESP bytes) for d before passing it to the server, and the requests after it on
// the same connection with it; d <= 0 ends it.
func (p *Proxy) Delay(text string, d time.Duration) {
	if d <= 0 {
		p.delay.Store(nil)
		return
	}
	p.delay.Store(&delayRule{text: bytes.ToLower([]byte(text)), d: d})
}

// NewProxy starts a proxy on a free 127.0.0.1 port in front of target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
	go p.serve()
	return p, nil
}

// DropReplyTo arms the proxy: the reply to the next request containing text (matched
// case-insensitively in the raw RESP bytes) is lost.
func (p *Proxy) DropReplyTo(text string) {
	b := bytes.ToLower([]byte(text))
	p.drop.Store(&b)
}

// Watch makes the proxy keep, from now on, a copy of every request containing text
// (matched case-insensitively in the raw RESP bytes), for Seen.
func (p *Proxy) Watch(text string) {
	b := bytes.ToLower([]byte(text))
	p.watch.Store(&b)
}

// Seen returns the requests Watch kept, in the order they reached the proxy.
func (p *Proxy) Seen() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.seen...)
}

// Dropped returns how many replies were lost.
func (p *Proxy) Dropped() int { return int(p.dropped.Load()) }

// Lost returns the replies lost, one per drop in the order they happened, as the
// server sent them (what it had sent when the client's connection was closed).
func (p *Proxy) Lost() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.lost...)
}

// Close stops the proxy and its connections.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.hang.Load() {
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			go p.swallow(c)
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(c, s)
	}
}

// pipe forwards requests from c to s and replies back, losing one reply when armed.
func (p *Proxy) pipe(c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	var cut atomic.Bool // set: replies are no longer passed on
	var (
		lostMu   sync.Mutex
		lost     []byte                // what the server answered after the cut
		answered = make(chan struct{}) // closed when it first answered after the cut
	)
	replies := make(chan []byte, 64)
	go func() {
		defer close(replies)
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				replies <- append([]byte(nil), buf[:n]...)
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		for r := range replies {
			if cut.Load() {
				lostMu.Lock()
				if lost == nil {
					close(answered)
				}
				lost = append(lost, r...)
				lostMu.Unlock()
				continue
			}
			if _, err := c.Write(r); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	// A request's bytes may come in two reads: a text is looked for in a read with the
	// end of the read before it (tail), so a text the split cuts in two is still found.
	const tailLen = 256
	var tail []byte
	for {
		n, err := c.Read(buf)
		if n > 0 && p.hang.Load() {
			continue // swallowed: a hung server reads and never answers
		}
		if n > 0 {
			req := buf[:n]
			lower, old := append(tail, bytes.ToLower(req)...), len(tail)
			in := func(text []byte) bool { // text ends in this read
				i := bytes.LastIndex(lower, text)
				return i >= 0 && i+len(text) > old
			}
			tail = append([]byte(nil), lower[max(0, len(lower)-tailLen):]...)
			if w := p.watch.Load(); w != nil && in(*w) {
				p.mu.Lock()
				p.seen = append(p.seen, append([]byte(nil), req...))
				p.mu.Unlock()
			}
			if r := p.delay.Load(); r != nil && in(r.text) {
				time.Sleep(r.d)
			}
			if want := p.drop.Load(); want != nil && in(*want) && p.drop.CompareAndSwap(want, nil) {
				// stop passing replies on, let the server run the request, then cut
				cut.Store(true)
				p.runUnanswered(s, req, answered)
				lostMu.Lock()
				reply := append([]byte(nil), lost...)
				lostMu.Unlock()
				p.mu.Lock()
				p.lost = append(p.lost, reply)
				p.mu.Unlock()
				p.dropped.Add(1)
				return // closing c: the client sees EOF, the drop counted
			}
			if _, err := s.Write(req); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// swallow reads c until it closes, answering nothing.
func (p *Proxy) swallow(c net.Conn) {
	defer c.Close()
	_, _ = io.Copy(io.Discard, c)
}

// runUnanswered sends req to the server and waits until the server answers, so that
// it has run req when the client's connection is closed without the answer: a
// client that sends it again on EOF finds its effects. It waits for the answer up to
// cutWait (a server that never answers), and after its first bytes a little while
// (cutSettle) so that all of it is counted lost.
func (p *Proxy) runUnanswered(s net.Conn, req []byte, answered <-chan struct{}) {
	s.Write(req)
	select {
	case <-answered:
		time.Sleep(cutSettle)
	case <-time.After(cutWait):
	}
}

// cutWait bounds how long a drop waits for the server's answer; cutSettle is how long
// it waits after the answer's first bytes for the rest of it. A fixed 50ms before was
// too short on a loaded host: the client's retry ran before the request it lost.
const (
	cutWait   = 10 * time.Second
	cutSettle = 5 * time.Millisecond
)
