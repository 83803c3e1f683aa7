package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// auditTail runs after a limiter script's own code (wrapped in jt_audited) and appends
// "<token> <n>" to the list "<KEYS[1]>:audit" for each request of the call that was an
// acquire granting n > 0 permits anew (internal/protocol: seven integers per request,
// granted 1; a task's booking found, 2, was counted when it was made). The list shares
// the state key's hash slot (and so its node, and its replication).
const auditTail = `
end
local r = jt_audited()
if type(r) == 'table' and r.err == nil then
  for i = 1, #ARGV - 2 do
    local n = tonumber((string.match(ARGV[i + 2], '^a (%d+) ')))
    if n and n > 0 and r[7 * i - 6] == 1 then
      local k = KEYS[1] .. ':audit'
      redis.call('RPUSH', k, string.format('%d %d', r[7 * i - 2], n))
      redis.call('PEXPIRE', k, 600000)
    end
  end
end
return r
`

// AuditSource returns the limiter script src with a server-side record of what it
// grants: the same Lua runs, and in the same call every grant is appended to the list
// "<KEYS[1]>:audit" (kept 10 minutes). What the server did can then be compared with
// what callers were told (RecordGrants), e.g. to find a call charged twice, or grants
// a failover forgot. Read the record with ReadAudit.
func AuditSource(src string) string {
	return "local function jt_audited()\n" + src + auditTail
}

// ReadAudit returns the grants an audited script (AuditSource) made on the state key key, in the order
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
