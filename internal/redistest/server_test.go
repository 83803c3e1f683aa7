package redistest

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
)

// A cluster is handed over with its epochs settled: each master's config epoch is its
// own, and every node's current epoch is the greatest of them, so that a slot's new
// owner (CLUSTER SETSLOT NODE, SlotMove.End) takes an epoch past every other. With a
// target that knew less, a node still mapping the slot to the source told it to give
// the slot back, and source and target answered MOVED to each other for good
// (TestLostReplyAfterAMoveChargesOnce, under load; see StartClusterWithReplicas).
func TestClusterStartsWithSettledEpochs(t *testing.T) {
	for i := range 3 { // epochs settle by gossip, at a different pace each start
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			tc, _ := OwnCluster(t)
			ctx := context.Background()
			clients := map[*Server]*redis.Client{}
			for _, n := range tc.Masters {
				clients[n] = redis.NewClient(&redis.Options{Addr: n.Addr})
				t.Cleanup(func() { clients[n].Close() })
			}
			own := map[string]int{} // each master's config epoch, as it says
			for _, n := range tc.Masters {
				c := clients[n]
				id, epoch := c.ClusterMyID(ctx).Val(), infoInt(c.ClusterInfo(ctx).Val(), "cluster_my_epoch")
				for other, e := range own {
					if e == epoch {
						t.Errorf("masters %s and %s share the config epoch %d", other, id, e)
					}
				}
				own[id] = epoch
			}
			greatest := 0
			for _, e := range own {
				greatest = max(greatest, e)
			}
			for _, n := range tc.Masters {
				if current := infoInt(clients[n].ClusterInfo(ctx).Val(), "cluster_current_epoch"); current < greatest {
					t.Errorf("%s: current epoch %d, want %d (the greatest config epoch, %v)", n.Addr, current, greatest, own)
				}
			}
		})
	}
}
