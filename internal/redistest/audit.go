package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// auditTail runs after a limiter script's own code (wrapped in jt_audited) and, when
// the call was an acquire that granted n > 0 permits, appends "<token> <n>" to the list
// "<KEYS[1]>:audit" (a batch's requests each, in order), which shares the state key's
// hash slot (and so its node, and its replication).
const auditTail = `
end
local r = jt_audited()
local function jt_audit(r, op, n)
  if type(r) == 'table' and r.err == nil and op == '0' and r[1] == 1 and n ~= '0' then
    local k = KEYS[1] .. ':audit'
    redis.call('RPUSH', k, string.format('%d %s', r[5], n))
    redis.call('PEXPIRE', k, 600000)
  end
end
if ARGV[1] == '4' and type(r) == 'table' and r.err == nil then -- a batch: five integers per request (lua/batch.lua)
  for i = 1, math.floor(#r / 5) < tonumber(ARGV[2]) and 0 or tonumber(ARGV[2]) do
    local b = 5 * i
    jt_audit({r[b - 4], r[b - 3], r[b - 2], r[b - 1], r[b]}, ARGV[3 * i], ARGV[3 * i + 1])
  end
else
  jt_audit(r, ARGV[1], ARGV[2])
end
return r
`

// AuditScript returns the limiter script src with a server-side record of what it
// grants: the same Lua runs, and in the same call every grant is appended to the list
// "<KEYS[1]>:audit" (kept 10 minutes). What the server did can then be compared with
// what callers were told (RecordGrants), e.g. to find a call charged twice, or grants
// a failover forgot. Read the record with ReadAudit.
func AuditScript(src string) *redis.Script {
	return redis.NewScript("local function jt_audited()\n" + src + auditTail)
}

// ReadAudit returns the grants an AuditScript made on the state key key, in the order
// it made them.
func ReadAudit(ctx context.Context, c redis.UniversalClient, key string) ([]Grant, error) {
	rows, err := c.LRange(ctx, key+":audit", 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make([]Grant, 0, len(rows))
	for _, row := range rows {
		f := strings.Fields(row)
		if len(f) != 2 {
			return nil, fmt.Errorf("audit of %s: bad row %q", key, row)
		}
		at, err1 := strconv.ParseInt(f[0], 10, 64)
		n, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("audit of %s: bad row %q", key, row)
		}
		out = append(out, Grant{At: time.UnixMicro(at), N: n, Key: key})
	}
	return out, nil
}
