// Package jobmw is what the job-queue middlewares (asynqmw, and x/river's rivermw)
// share: what they know of a limiter, the pacer that keeps a process's starts within
// each limit, bookings and leases under a job's ID, how early to make a job that is
// handed back due again, the bound on jobs asleep, an attempt's sleep budget, and the
// pace of tries while Redis is unavailable. Each middleware keeps what its queue does differently:
// how a job waits, is handed back and comes back. It is internal: the API users see
// is the middlewares'.
package jobmw
