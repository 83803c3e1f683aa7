package redistest

import (
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
)

// A task's give-back removes that task's grant, not another task's booked for the
// same instant: the grant that stands is the one whose task may yet come back late
// to it (Overtaken), and a claim of it is not counted again.
func TestGiveBackRemovesItsTasksGrant(t *testing.T) {
	var g Grants
	at := time.UnixMicro(1_700_000_000_000_000)
	reply := func(status int64) []int64 {
		v := make([]int64, protocol.Width)
		v[0], v[2], v[4] = status, 2_000_000, at.UnixMicro()
		return v
	}
	now := time.Now()
	g.record("k", request{op: protocol.OpAcquire, n: 1, booking: "a"}, reply(1), now, now)
	g.record("k", request{op: protocol.OpAcquire, n: 1, booking: "b"}, reply(1), now, now)
	g.record("k", request{op: protocol.OpCancel, n: 1, x: 7, booking: "a"}, reply(1), now, now)
	list := g.List()
	if len(list) != 1 || list[0].Booking != "b" {
		t.Fatalf("grants standing after a's give-back: %+v, want b's alone", list)
	}
	// b's claim of its booking (2: found) is the grant recorded, not a new one.
	g.record("k", request{op: protocol.OpAcquire, n: 1, booking: "b"}, reply(2), now, now)
	if got := g.Total(); got != 1 {
		t.Fatalf("Total after b's claim: %d, want 1", got)
	}
}
