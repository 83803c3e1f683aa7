// Package rivermw keeps River job workers inside rate and in-flight limits shared
// through Redis, without failing, discarding or running twice a job because it was
// throttled, and without holding workers other jobs need.
//
// One Setup per River client supplies both halves: its Config fills in the
// river.Config, its Throttle, ThrottleFunc and Concurrency are the middleware. A
// throttled job books its slot, is snoozed until just before it, and sleeps the rest.
// The repository's docs/river.md tells how a job moves, what the Config gets, what
// River shows, and the failure modes.
package rivermw
