package throttle

// Seams for the package's tests: nothing in the production code exists for them.

// useScript makes the Limiter run s (a test's version of its script: a fake clock's,
// an audit's) in place of its own.
func (l *Limiter) useScript(s *script) {
	t := l.t
	l.t = newLimiterTarget(t.key, t.tag, s, t.keys, t.head, t.caps)
}

// useScript makes the Semaphore run s in place of its own.
func (s *Semaphore) useScript(sc *script) {
	t := s.t
	s.t = newSemaphoreTarget(t.key, t.tag, sc, t.keys, t.tail)
}

// stateKey returns the name of the Limiter's state key.
func (l *Limiter) stateKey() string { return l.t.keys[0] }

// lastResumed is the end of the pause whose resume ks handled last (server µs; 0: none).
func (ks *keyState) lastResumed() int64 {
	ks.heard.Lock()
	defer ks.heard.Unlock()
	return ks.ended[(ks.nended+len(ks.ended)-1)%len(ks.ended)]
}
