package throttle

import (
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

func TestMain(m *testing.M) {
	// go-redis's log without what TestACLLeastPrivilege's refusals make it say: it
	// drops each connection whose MULTI was refused, and a cluster client without
	// CLUSTER SLOTS says so on every call. (go-redis's logger is a variable of its
	// package: set here, before any test runs, not by a test beside others.)
	redis.SetLogger(logging.NewBlacklistLogger([]string{"Conn has unread data", "NOPERM"}))
	// The parallel tests (see parallel) spend most of their time waiting on servers
	// started for them: a failover, ACL users, fleets of processes, a full Redis.
	redistest.Parallel(6)
	redistest.Main(m)
}
