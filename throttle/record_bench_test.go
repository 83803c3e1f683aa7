package throttle

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkRecordWrite is Allow (sliding window, allowed path, a transaction per
// call) with the key's record written along with every call ("every-call", which a
// Limiter does once per interval of 2.5s or more) and with none ("never", what every
// other call is): the difference is what one write costs the call that carries it,
// round trip and client included; set-server-µs is Redis's own time per SET of the
// record (INFO commandstats). Divide by the calls a process makes in an interval for
// the cost per call.
//
//	go test -run '^$' -bench BenchmarkRecordWrite -count 5 ./throttle/
func BenchmarkRecordWrite(b *testing.B) {
	be := benchBackend(b)
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		every int64 // 0: every call writes the record; else none does
	}{{"never", 1}, {"every-call", 0}} {
		b.Run(c.name, func(b *testing.B) {
			l, err := New(be.Client, "record-bench-"+c.name, Limit{Rate: 1_000_000_000, Period: 1_000_000_000}, WithKeyPrefix(be.Prefix), WithCoalescing(false))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := l.Allow(ctx); err != nil { // the first call writes it in any case
				b.Fatal(err)
			}
			l.shared.rec.every = 0
			l.shared.rec.due.Store(0)
			if c.every != 0 {
				l.shared.rec.due.Store(math.MaxInt64)
			}
			written.mu.Lock()
			delete(written.m, l.shared.rec.id) // what the first call noted
			written.mu.Unlock()
			if be.Real() {
				be.Client.ConfigResetStat(ctx)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if r, err := l.Allow(ctx); err != nil || !r.Allowed {
					b.Fatal(r, err)
				}
			}
			b.StopTimer()
			if be.Real() && c.every == 0 {
				info, _ := be.Client.Info(ctx, "commandstats").Result()
				for _, line := range strings.Split(info, "\r\n") {
					if v, ok := strings.CutPrefix(line, "cmdstat_set:"); ok {
						for _, f := range strings.Split(v, ",") {
							if n, ok := strings.CutPrefix(f, "usec_per_call="); ok {
								us, _ := strconv.ParseFloat(n, 64)
								b.ReportMetric(us, "set-server-µs")
							}
						}
					}
				}
			}
		})
	}
}

// BenchmarkRecordTake is what every call that may grant pays for the key's record
// when no write is due: reading the clock and one atomic load (see record.take).
//
//	go test -run '^$' -bench BenchmarkRecordTake ./throttle/
func BenchmarkRecordTake(b *testing.B) {
	r := newRecord(nil, "{bench-"+strconv.Itoa(b.N)+"}", SlidingWindow, []Limit{PerSecond(10)}, 50)
	r.every = time.Hour
	r.take(time.Now()) // the first is due
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if r.take(time.Now()) != nil {
				b.Error("a write was due again within the interval")
				return
			}
		}
	})
}
