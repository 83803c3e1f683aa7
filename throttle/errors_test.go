package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
)

// sendReplyError is an error reply as go-redis gives it: a redis.Error.
type sendReplyError string

func (e sendReplyError) Error() string { return string(e) }

func (sendReplyError) RedisError() {}

// scriptError maps each kind of failure to its sentinel, keeps the cause where it says
// so, and leaves the caller's own context error as it is. A request's failure is mapped
// by its code alone, never by its text: a key named "JTSTATE-x" or "WRONGTYPE-x" in a
// text changes nothing; an error Redis gave the script (code 0) reads as Redis's own.
func TestScriptErrorMapping(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		err       error
		want      error // nil: none of the package's sentinels
		keepCause bool
	}{
		{sendReplyError("JTARG head or request count"), ErrInvalidArgument, false}, // the call's as a whole
		{&failed{protocol.ErrArg, "JTARG n or its second field"}, ErrInvalidArgument, false},
		{&failed{protocol.ErrState, "{k}:l: not a jobthrottle state"}, ErrCorruptState, false},
		{&failed{protocol.ErrExceeds, "JTEXCEEDS n above the overridden limits"}, ErrExceedsLimit, false},
		{&failed{protocol.ErrAlg, "tb {k}:l"}, ErrAlgorithmMismatch, false},
		{&failed{protocol.ErrAlg, "xx {k}:l"}, ErrAlgorithmMismatch, false}, // a tag this release does not know
		{&failed{protocol.ErrAlg, "WRONGTYPE-x"}, ErrAlgorithmMismatch, false},
		{&failed{protocol.ErrState, "NOPERM {JTARG-x}:l"}, ErrCorruptState, false},
		{&failed{0, "ERR key {JTSTATE-x}:l"}, nil, true},
		{&failed{0, "NOPERM no permissions to access a key"}, ErrNoPermission, true},
		{&failed{0, "LOADING Redis is loading"}, ErrUnavailable, true},
		{sendReplyError("ERR JTSTATE sem not a zset"), nil, true}, // a text, not a code
		{sendReplyError("WRONGTYPE Operation against a key holding the wrong kind of value"), ErrCorruptState, false},
		{sendReplyError("NOPERM this user has no permissions to access one of the keys"), ErrNoPermission, true},
		{sendReplyError("ERR The user executing the script can't run this command or subcommand"), ErrNoPermission, true},
		{sendReplyError("EXECABORT Transaction discarded because of: NOPERM this user has no permissions to run the 'exec' command"), ErrNoPermission, true},
		{sendReplyError("LOADING Redis is loading the dataset in memory"), ErrUnavailable, true},
		{sendReplyError("CLUSTERDOWN The cluster is down"), ErrUnavailable, true},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), ErrUnavailable, true},
		{io.EOF, ErrUnavailable, true},
		{sendReplyError("ERR unknown command"), nil, true},
		{context.Canceled, nil, true},
		{fmt.Errorf("read: %w", context.DeadlineExceeded), ErrUnavailable, true}, // a timeout: a net.Error
	} {
		got := scriptError(ctx, "k", c.err)
		for _, s := range []error{ErrInvalidArgument, ErrCorruptState, ErrExceedsLimit, ErrAlgorithmMismatch, ErrNoPermission, ErrUnavailable} {
			if is := errors.Is(got, s); is != (s == c.want) {
				t.Errorf("scriptError(%q) = %v: errors.Is(%v) got %v, want %v", c.err, got, s, is, s == c.want)
			}
		}
		cause := c.err
		if f, ok := c.err.(*failed); ok && f.code == 0 { // Redis's own error, as go-redis gives one
			cause = redisError(f.text)
		}
		if is := errors.Is(got, cause); is != c.keepCause {
			t.Errorf("scriptError(%q) = %v: wraps the cause %v, want %v", c.err, got, is, c.keepCause)
		}
	}
	// ErrAlg names the algorithm whose state the key holds by its head's tag
	var ae *AlgorithmError
	if err := scriptError(ctx, "k", &failed{protocol.ErrAlg, "tb {k}:l"}); !errors.As(err, &ae) || ae.Found != TokenBucket || ae.Key != "k" {
		t.Errorf("scriptError of ErrAlg \"tb ...\": %v (%+v), want an *AlgorithmError found TokenBucket", err, ae)
	}
	// a call whose own context ended is not an outage, whatever the connection says
	done, cancel := context.WithCancel(ctx)
	cancel()
	if got := scriptError(done, "k", io.EOF); errors.Is(got, ErrUnavailable) || !errors.Is(got, io.EOF) {
		t.Errorf("scriptError with the context ended: got %v, want io.EOF without ErrUnavailable", got)
	}
}
