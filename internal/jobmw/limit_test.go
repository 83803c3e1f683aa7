package jobmw

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// A booking not made (a tenant's turn has not come, or the permit is further than the
// job may wait) is slept for, not an error: Wait ends with its context, or returns
// ErrMoved (ask again) once the permit is due.
func TestWaitAsksAgainWhenNotBooked(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		lim, err := throttle.New(b.Client, "not-booked", throttle.PerHour(1), throttle.WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if first, _, err := Book(ctx, lim, "job-1", 0, 0); err != nil || !first.OK() {
			t.Fatalf("the first permit: OK %v, %v", first.OK(), err)
		}
		second, _, err := Book(ctx, lim, "job-2", 0, 0)
		if err != nil || second.OK() || second.Delay() < 59*time.Minute {
			t.Fatalf("a permit an hour ahead, for a job that may not wait: OK %v, delay %v, %v; want not booked, due in an hour",
				second.OK(), second.Delay(), err)
		}
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := second.Wait(done); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait with a done context: %v, want context.Canceled", err)
		}
		short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
		defer stop()
		if err := second.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait past its context's deadline: %v, want context.DeadlineExceeded", err)
		}
	})
	due := Booking{r: waiter.NewReservation(false, 10*time.Millisecond, nil)}
	if err := due.Wait(context.Background()); !errors.Is(err, ErrMoved) {
		t.Fatalf("Wait on a booking not made, once its time has come: %v, want ErrMoved", err)
	}
}
