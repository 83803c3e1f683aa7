// Package throttle provides rate limiters and in-flight limits that many processes
// share through Redis.
//
// A Limiter enforces one or more rates on a key ("100 per minute to this vendor", "10
// per second and 500 per hour") for every process that uses the same Redis, key and
// prefix; a Semaphore limits how many holders run at once ("5 reports in flight"). Each
// decision is one atomic script call that reads Redis's clock, so the processes' clocks
// do not matter, no two processes can take the last permit, and a denied caller learns
// exactly how long until its permits come:
//
//	lim, err := throttle.New(rdb, "vendor-api", throttle.PerMinute(100))
//	...
//	if err := lim.Wait(ctx); err != nil { // sleeps until this caller's permit
//		return err
//	}
//
// Which call to use:
//   - Wait and WaitN book permits and sleep until they take effect: a worker loop.
//     Waiters are served in arrival order across every process, at about one Redis call
//     per permit, without polling; a caller whose context ends gives its permits back.
//   - Allow and AllowN take permits now or not at all, and say when they would come:
//     to drop or defer work (an HTTP handler answering 429).
//   - Reserve books permits and leaves the waiting to the caller (waiter.Reservation):
//     to hand a job back to its queue until its slot, or to decide with the delay in hand.
//   - Semaphore.Do (or Acquire, TryAcquire) runs work under a lease of an in-flight limit.
//
// The algorithms (WithAlgorithm): SlidingWindow, the default, never lets more than Rate
// permits take effect in any window of Period, exactly; TokenBucket allows Burst at once
// and then Rate per Period, with golang.org/x/time/rate's decisions; FixedWindow and
// SlidingCounter trade exactness at a window's edge, or a little of the rate, for
// constant or bounded memory.
//
// Every key lies under one hash tag, "{<prefix><key>}", so it works on Redis Cluster,
// and has a TTL, so idle limiters leave nothing behind. An operator can pause a key
// (Pause), override its rates for every process (Override) and read its live state
// (Inspect), or do the same from the command line (cmd/jobthrottle).
//
// A denial is not an error: Result.Allowed is false and RetryAfter says when. Errors
// wrap the Err* sentinels; with Redis unreachable (ErrUnavailable) a Limiter follows
// its FailurePolicy: FailClosed (the default), FailOpen or FailLocal. Every call
// returns by its context's deadline and its call timeout, whatever Redis does.
//
// Calls made at once by many goroutines of a process share round trips, each still
// decided on its own, in arrival order. Limiters and Semaphores are cheap handles;
// build them once or per task, as is convenient.
package throttle
