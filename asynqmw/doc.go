// Package asynqmw keeps asynq task handlers inside rate and in-flight limits shared
// through Redis, without failing, archiving or running twice a task because it was
// throttled, and without letting a throttled backlog take the workers other task types
// need.
//
// One Setup per server supplies both halves: its Config fills in the asynq.Config,
// its Throttle, ThrottleFunc and Concurrency are the middleware. A throttled task
// books its slot, goes back to asynq until just before it, and sleeps the rest in its
// worker. The repository's docs/asynq.md tells how a task moves, what the Config gets,
// what asynq and asynqmon show, and the failure modes.
package asynqmw
