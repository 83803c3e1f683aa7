package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrAlgorithmMismatch: the key's state was written by a Limiter of another algorithm.
// Two algorithms on one key would each keep their own state and each admit up to the
// limit, so the second is refused. The error is an *AlgorithmError.
var ErrAlgorithmMismatch = errors.New("jobthrottle: the key is used by a limiter of another algorithm")

// AlgorithmError is the error of a Limiter whose key holds another algorithm's state
// (see ErrAlgorithmMismatch, which it wraps). A grant that would create the Limiter's
// own state checks the other algorithms' keys first, in the same atomic script call,
// so no permit is granted twice; calls that create nothing (denials, reads) are not
// checked.
//
// To move a key to another algorithm on purpose (a rollout), call TakeOver on a
// Limiter of the new algorithm, or run `jobthrottle reset KEY`: the old state is
// deleted and the new algorithm starts from a full limit (up to one window more can
// pass while it does); Limiters of the old algorithm then get this error.
type AlgorithmError struct {
	Key   string    // the key, without prefix
	Want  Algorithm // the Limiter's algorithm
	Found Algorithm // the algorithm whose state the key holds
}

func (e *AlgorithmError) Error() string {
	return fmt.Sprintf("jobthrottle: key %q holds %v state; this limiter is %v (use one algorithm per key, or TakeOver)", e.Key, e.Found, e.Want)
}

func (e *AlgorithmError) Unwrap() error { return ErrAlgorithmMismatch }

// stateSuffixes are the state keys' suffixes, by algorithm.
var stateSuffixes = map[string]Algorithm{"sw": SlidingWindow, "sc": SlidingCounter, "tb": TokenBucket, "fw": FixedWindow}

// algorithmKeys returns a Limiter's KEYS: its state key, the control key, then the
// other algorithms' state keys, which a grant creating the state key checks.
func algorithmKeys(tag, suffix string) []string {
	keys := []string{tag + ":" + suffix, tag + ":pause"}
	for _, s := range []string{"sw", "sc", "tb", "fw"} {
		if s != suffix {
			keys = append(keys, tag+":"+s)
		}
	}
	return keys
}

// algorithmError maps a script's "JTALG <key>" failure.
func algorithmError(key, msg string, err error) error {
	e := &AlgorithmError{Key: key, Found: -1}
	if i := strings.Index(msg, "JTALG "); i >= 0 {
		rest := msg[i+len("JTALG "):]
		if j := strings.Index(rest, "}:"); j >= 0 && len(rest) >= j+4 {
			if a, ok := stateSuffixes[rest[j+2:j+4]]; ok {
				e.Found = a
			}
		}
	}
	if e.Found < 0 {
		return fmt.Errorf("%w: key %q: %v", ErrAlgorithmMismatch, key, err)
	}
	return e
}

// TakeOver makes the key this Limiter's: it deletes the state the other algorithms
// keep under it (see AlgorithmError), so this Limiter's next grant starts its own.
// The limits start afresh: up to one window's worth more can pass than if the state
// had carried over. The pause and any override stay; the key's record (see
// ReadRecord) names this Limiter's algorithm and limits. Limiters of the other
// algorithms on the key get an *AlgorithmError from their next grant on.
func (l *Limiter) TakeOver(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	pipe := l.rdb.TxPipeline() // one hash slot: one transaction
	pipe.Del(ctx, l.keys[2:]...)
	l.shared.rec.queue(ctx, pipe) // the key's record names this Limiter's algorithm from now on
	if _, err := pipe.Exec(ctx); err != nil {
		return scriptError(ctx, l.key, err)
	}
	return nil
}
