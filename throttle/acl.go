package throttle

import "strings"

// aclCommands are the commands a Redis user needs to use Limiters and Semaphores: those
// the client sends (CLUSTER SLOTS and ASKING too, which a cluster's layout and a slot
// migrating take, so that one user's rules serve a redis-server and a cluster alike) and
// those the scripts run, which Redis checks against the calling user too.
// TestACLLeastPrivilege checks it is exactly what the library uses, and
// TestACLRulesThroughAReshard that ASKING is needed.
var aclCommands = []string{
	"evalsha", "eval", "multi", "exec", "subscribe", "unsubscribe", "cluster|slots", "asking",
	"time", "type", "get", "set", "pexpire", "pttl", "del", "unlink", "publish",
	"lindex", "lrange", "llen", "ltrim", "rpush", "lset",
	"zcard", "zcount", "zscore", "zrange", "zrevrange", "zrangebyscore", "zremrangebyscore", "zrem", "zadd", "zrank",
}

// ACLRules returns the Redis ACL rules (Redis 6.2 or later) that let a user do all a
// Limiter or a Semaphore with key prefix prefix (WithKeyPrefix; "jobthrottle:" by
// default) does, and nothing else: the commands it sends and its scripts run, the
// keys under "{<prefix>" and the wake-up channels there; on a Redis Cluster, set the
// user on every node. For example:
//
//	ACL SETUSER worker on >secret <ACLRules("jobthrottle:")>
//
// A user without one of them gets errors wrapping ErrNoPermission.
func ACLRules(prefix string) string {
	return "resetkeys ~{" + prefix + "* resetchannels &{" + prefix + "* -@all +" + strings.Join(aclCommands, " +")
}
