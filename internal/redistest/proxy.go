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
				continue
			}
			if _, err := c.Write(r); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 && p.hang.Load() {
			continue // swallowed: a hung server reads and never answers
		}
		if n > 0 {
			req := buf[:n]
			if w := p.watch.Load(); w != nil && bytes.Contains(bytes.ToLower(req), *w) {
				p.mu.Lock()
				p.seen = append(p.seen, append([]byte(nil), req...))
				p.mu.Unlock()
			}
			if r := p.delay.Load(); r != nil && bytes.Contains(bytes.ToLower(req), r.text) {
				time.Sleep(r.d)
			}
			if want := p.drop.Load(); want != nil && bytes.Contains(bytes.ToLower(req), *want) && p.drop.CompareAndSwap(want, nil) {
				// stop passing replies on, let the server run the request, then cut
				cut.Store(true)
				p.cutAfter(c, s, req)
				return
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

// cutAfter sends req to the server, gives it time to run and answer, and closes the
// client's connection without the answer.
func (p *Proxy) cutAfter(c, s net.Conn, req []byte) {
	s.Write(req)
	time.Sleep(50 * time.Millisecond)
	p.dropped.Add(1)
	c.Close()
}
