// Package booking lets the job queues' middlewares (through internal/jobmw) book
// permits and queue for semaphore slots under a task's ID, through throttle's ordinary
// calls: a context carrying a *Task makes Limiter.Reserve book for the task (a later
// Reserve for the same task, from any process, gets the same booking back, so a task
// handed back to its queue keeps its place in line), and makes a Semaphore's TryAcquire
// and Acquire wait in the task's own place in the queue. It is internal: the API users
// see has no notion of a task.
package booking

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// MaxID is the longest task ID, in bytes.
const MaxID = 512

// Task is a task's identity for its booking, and what the call found.
type Task struct {
	// ID is the task's ID: its booking is recorded under it, and its place in a
	// semaphore's queue is named by it.
	ID string
	// Late is how long after its time a booking may still be used: a task that comes
	// back up to Late after its slot runs on it (Redis counted its permits then).
	Late time.Duration
	// Kept is set by Reserve: the task's booking was found, not made.
	Kept bool
	// Pass is set by Reserve: it waits while this process holds the limiter's key (a
	// Pause of this process), and reports whether it did. A task whose permit came due
	// inside a hold must not use it: it books again.
	Pass func(ctx context.Context) (held bool, err error)
}

type key struct{}

// With returns ctx carrying t.
func With(ctx context.Context, t *Task) context.Context { return context.WithValue(ctx, key{}, t) }

// From returns the task ctx carries, or nil.
func From(ctx context.Context) *Task {
	t, _ := ctx.Value(key{}).(*Task)
	return t
}

// Check returns why t cannot be used, or nil.
func (t *Task) Check() error {
	if t.ID == "" || len(t.ID) > MaxID {
		return fmt.Errorf("task id of %d bytes, want 1 to %d", len(t.ID), MaxID)
	}
	if t.Late < 0 {
		return fmt.Errorf("late %v is negative", t.Late)
	}
	return nil
}

// Place is the task's place in a semaphore's queue: 128 bits of its ID's SHA-256, in
// hex (a lease's form).
func (t *Task) Place() string {
	sum := sha256.Sum256([]byte(t.ID))
	return hex.EncodeToString(sum[:16])
}

type settleKey struct{}

// WithSettle returns ctx carrying settle: a middleware's settle of the booking it made
// on a job's estimated costs (waiter.Reservation's Settle), for the job's handler to
// call through waiter.Settle.
func WithSettle(ctx context.Context, settle func(ctx context.Context, actual map[string]int) error) context.Context {
	return context.WithValue(ctx, settleKey{}, settle)
}

// SettleFrom returns the settle ctx carries, or nil.
func SettleFrom(ctx context.Context) func(ctx context.Context, actual map[string]int) error {
	f, _ := ctx.Value(settleKey{}).(func(ctx context.Context, actual map[string]int) error)
	return f
}
