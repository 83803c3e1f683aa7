package throttle

import "strings"

// aclCommands are the commands a Redis user needs to use Limiters and Semaphores:
// those the client sends (scripts by SHA, by source after a SCRIPT FLUSH or restart,
// inside MULTI/EXEC so that a lost reply cannot run one twice; SET of the key's
// record, sent along with a call now and then, and GET and PTTL to read it
// (ReadRecord); the semaphore's wake-up subscription) and those the scripts run, which Redis checks against the calling
// user too (Inspect's scripts read the state key's TTL with PTTL; a grant that creates
// a state key checks with EXISTS that no other algorithm's is there; the token
// bucket's and the fixed window's fast paths read the state and the control key
// with one MGET).
// TestACLLeastPrivilege checks it is exactly what the library uses.
var aclCommands = []string{
	"evalsha", "eval", "multi", "exec", "subscribe", "unsubscribe",
	"time", "get", "mget", "set", "pexpire", "pttl", "exists", "del", "unlink",
	"lrange", "lindex", "llen", "ltrim", "rpush", "lset",
	"zcard", "zcount", "zscore", "zrange", "zrangebyscore", "zremrangebyscore", "zrem", "zadd", "zrank", "publish",
}

// ACLRules returns the Redis ACL rules (Redis 6.2 or later) that let a user do all a
// Limiter or a Semaphore with key prefix prefix (WithKeyPrefix; "jobthrottle:" by
// default) does, and nothing else: the commands it sends and its scripts run, the
// keys under "{<prefix>" and the semaphores' wake-up channels there. For example:
//
//	ACL SETUSER worker on >secret <ACLRules("jobthrottle:")>
//
// A user without one of them gets errors wrapping ErrNoPermission.
func ACLRules(prefix string) string {
	var b strings.Builder
	b.WriteString("resetkeys ~{" + prefix + "* resetchannels &{" + prefix + "* -@all")
	for _, c := range aclCommands {
		b.WriteString(" +" + c)
	}
	return b.String()
}
