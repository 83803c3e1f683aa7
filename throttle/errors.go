package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/redis/go-redis/v9"
)

// Errors returned by this package. Test for them with errors.Is: the errors returned
// wrap them with details (which key, which value, the cause).
var (
	// ErrInvalidLimit: a Limit that cannot be enforced (rate, period or burst out of
	// range; see Limit). New and NewSemaphore return it.
	ErrInvalidLimit = errors.New("jobthrottle: invalid limit")

	// ErrExceedsLimit: n is larger than the limit can ever grant at once (Rate for the
	// sliding window, fixed window and sliding counter, Burst for the token bucket; the
	// smallest over all limits, or an operator's override of them). Nothing is taken.
	ErrExceedsLimit = errors.New("jobthrottle: n exceeds what the limit can ever grant at once")

	// ErrInvalidArgument: a negative n, a negative wait, an option that does not fit.
	ErrInvalidArgument = errors.New("jobthrottle: invalid argument")

	// ErrInvalidKey: an empty key, a key and prefix whose hash tag would be empty, or
	// longer than 512 bytes together.
	ErrInvalidKey = errors.New("jobthrottle: invalid key")

	// ErrNilClient: New or NewSemaphore was given a nil Redis client.
	ErrNilClient = errors.New("jobthrottle: nil redis client")

	// ErrCorruptState: a Redis key of the limiter's holds data jobthrottle did not write
	// (a value of another type, or text it cannot read). Nothing was changed, the key
	// included; delete it to start over.
	ErrCorruptState = errors.New("jobthrottle: redis key holds data jobthrottle did not write")

	// ErrUnavailable: Redis could not be reached or cannot serve now, whoever asks
	// (connection refused or reset, the go-redis client closed, a timeout, a full
	// Redis's OOM, LOADING, BUSY, READONLY or MASTERDOWN during a failover,
	// CLUSTERDOWN, a slot moving between Cluster nodes, the server's client limit…: see
	// unavailableReplies), or did not answer before the call's deadline or call
	// timeout, whatever the client's options. The error wraps the cause as well, when
	// known, in Redis's own words; one for a missed deadline also matches
	// context.DeadlineExceeded. Nothing was granted (see FailurePolicy for the
	// alternatives).
	ErrUnavailable = errors.New("jobthrottle: redis unavailable")

	// ErrLeaseLost: a Semaphore lease is no longer held: it expired before Extend or
	// Release reached Redis (its slot may already be someone else's), or it was
	// released. Nothing was freed or renewed.
	ErrLeaseLost = errors.New("jobthrottle: semaphore lease lost")

	// ErrNoPermission: the Redis user lacks a permission jobthrottle needs (see
	// ACLRules). The error wraps Redis's refusal, which names the command, key or
	// channel.
	ErrNoPermission = errors.New("jobthrottle: redis user lacks a permission (see throttle.ACLRules)")

	// ErrUnexpectedReply: Redis answered a script with something it does not return,
	// e.g. a proxy in between that rewrote the reply.
	ErrUnexpectedReply = errors.New("jobthrottle: unexpected reply from redis script")

	// ErrAlgorithmMismatch: the key's state was written by a Limiter of another
	// algorithm. Two algorithms on one key would each keep their own state and each
	// admit up to the limit, so the second is refused. The error is an *AlgorithmError.
	ErrAlgorithmMismatch = errors.New("jobthrottle: the key is used by a limiter of another algorithm")
)

// AlgorithmError is the error of a Limiter whose key holds another algorithm's state
// (see ErrAlgorithmMismatch, which it wraps): every algorithm keeps its state in the same
// key, whose meta names the algorithm.
// To move a key to another algorithm (a rollout), delete its state (`jobthrottle reset
// KEY`): the new algorithm starts from a full limit.
type AlgorithmError struct {
	Key   string    // the key, without prefix
	Want  Algorithm // the Limiter's algorithm
	Found Algorithm // the algorithm whose state the key holds
}

func (e *AlgorithmError) Error() string {
	return fmt.Sprintf("jobthrottle: key %q holds %v state; this limiter is %v (use one algorithm per key)", e.Key, e.Found, e.Want)
}

func (e *AlgorithmError) Unwrap() error { return ErrAlgorithmMismatch }

// scriptError maps a failed call to this package's errors: a request's failure by its
// code (internal/protocol), Redis's own errors by their prefix (see isUnavailable);
// anything else is wrapped as it is.
func scriptError(ctx context.Context, key string, err error) error {
	var f *failed
	if errors.As(err, &f) {
		switch f.code {
		case protocol.ErrState:
			return fmt.Errorf("%w: key %q: %s", ErrCorruptState, key, f.text)
		case protocol.ErrAlg:
			return algorithmError(key, f.text)
		case protocol.ErrExceeds:
			return fmt.Errorf("%w: key %q: %s", ErrExceedsLimit, key, f.text)
		case protocol.ErrArg:
			return fmt.Errorf("%w: key %q: %s", ErrInvalidArgument, key, f.text)
		}
		err = redisError(f.text) // 0: an error Redis gave the script, by its prefix below
	}
	if isUnavailable(ctx, err) {
		return fmt.Errorf("%w: key %q: %w", ErrUnavailable, key, err)
	}
	msg := strings.TrimPrefix(err.Error(), execAbortCause)
	switch {
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return fmt.Errorf("%w: key %q: %v", ErrCorruptState, key, err)
	case strings.HasPrefix(msg, "JTARG"): // an argument of the call as a whole
		return fmt.Errorf("%w: key %q: %v", ErrInvalidArgument, key, err)
	case strings.HasPrefix(msg, "NOPERM"), strings.Contains(msg, "The user executing the script can't"):
		return fmt.Errorf("%w: key %q: %w", ErrNoPermission, key, err)
	}
	return fmt.Errorf("jobthrottle: key %q: %w", key, err)
}

// execAbortCause starts the error of a transaction Redis refused that names the refusal
// of a command it queued: that refusal is what counts.
const execAbortCause = "EXECABORT Transaction discarded because of: "

// redisError is an error Redis gave a script, as go-redis gives Redis's replies.
type redisError string

func (e redisError) Error() string { return string(e) }

// RedisError marks it as a reply of Redis's own (go-redis's redis.Error).
func (redisError) RedisError() {}

// algorithmError maps an ErrAlg failure, whose text starts with the head tag of the
// algorithm whose state the key holds.
func algorithmError(key, text string) error {
	found, _, _ := strings.Cut(text, " ")
	for i, a := range algorithms {
		if a.tag == found {
			return &AlgorithmError{Key: key, Found: Algorithm(i)}
		}
	}
	return fmt.Errorf("%w: key %q: %s", ErrAlgorithmMismatch, key, text)
}

// isUnavailable reports whether err, from a call made with ctx, means Redis could not
// be reached or cannot serve now (a failover, a restart, a full memory, a cluster
// reshaping): the errors the failure policy covers and ErrUnavailable wraps. The
// caller's own context ending is not one of them (a network timeout also matches
// context.DeadlineExceeded, so it is ctx that tells them apart). This is the one place
// that sorts Redis's conditions from the caller's faults.
func isUnavailable(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return false
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) ||
		errors.Is(err, redis.ErrClosed) { // closed by its owner: as a call in flight then, whose connection closed
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := strings.TrimPrefix(rerr.Error(), execAbortCause) // a NOPERM's is not unavailable
		for _, p := range unavailableReplies {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}

// unavailableReplies are the beginnings of Redis's error replies that say it cannot
// serve now, whoever asks and whatever they ask: the server's state, not the caller's
// input or a key's contents. EXECABORT without a cause is a transaction refused for one
// of these: a call queued in MULTI that Redis refused (OOM, LOADING, BUSY…); one
// that names its cause ("because of: NOPERM …", EXEC refused) is that cause's.
// Redis writes "ERR max number of clients reached" on a connection it then closes;
// go-redis reads it when its first command is written before the close, and otherwise
// reports the closed connection (broken pipe, reset), which is unavailable too.
var unavailableReplies = []string{
	"LOADING ",     // restarting: loading its data set
	"BUSY ",        // another client's script or function has run too long
	"OOM ",         // full: used memory above maxmemory, under noeviction
	"MISCONF ",     // writes refused: a snapshot failed (stop-writes-on-bgsave-error)
	"READONLY ",    // a replica: the master failed over, or the client still writes to the old one
	"MASTERDOWN ",  // a replica cut off from its master (replica-serve-stale-data no)
	"NOREPLICAS ",  // fewer replicas than min-replicas-to-write
	"CLUSTERDOWN ", // a slot uncovered, or the cluster not formed
	"TRYAGAIN ",    // a slot migrating, the call's keys split between two nodes
	"MOVED ",       // a slot moved: the cluster client follows it, up to its limit
	"ASK ",         // a slot migrating: the same
	"EXECABORT ",
	"ERR max number of clients reached",
}
