// Package metrics exports jobthrottle's decisions and live limiter state as Prometheus
// metrics.
//
// Import this package for the limiters, semaphores and HTTP transports (packages
// throttle and waiter); it does not bring asynq into the build. The asynq middleware's
// metrics (package asynqmw) are in the subpackage asynqmetrics, which does.
//
// Both live in their own module (github.com/jobthrottle/jobthrottle/x), as asynq's
// x/metrics does, so that the core module keeps no dependency on client_golang.
package metrics

import (
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/x/metrics/internal/vec"
	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a request for permits, the "result" label (OpenTelemetry's rate-limiting
// semantic conventions: acquired, limited, canceled).
const (
	ResultAcquired = "acquired" // granted, at once or booked ahead
	ResultLimited  = "limited"  // denied: nothing granted or booked
	ResultCanceled = "canceled" // a booking given back
)

// OtherKey is the key label of every key beyond the collector's MaxKeys.
const OtherKey = "_other"

// Collector is a prometheus.Collector of jobthrottle's metrics. Its hooks count the
// decisions of the limiters, semaphores and HTTP transports built with them; at
// scrape time it reads the live state of the limiters and semaphores given to Watch
// and WatchSemaphore. The asynq middleware's decisions are counted by
// asynqmetrics.Collector, registered beside it.
//
// Attach it with one line per limiter (or semaphore), and register it once:
//
//	m := metrics.New()
//	prometheus.MustRegister(m)
//	lim, err := throttle.New(rdb, "vendor-api", limit, throttle.WithHooks(m.Hooks()))
//	sem, err := throttle.NewSemaphore(rdb, "reports", 5, throttle.WithSemaphoreHooks(m.SemaphoreHooks()))
//	m.Watch(lim) // optional: live gauges at scrape time
//
// Metrics (every counter and the histograms carry the label key, the limiter's key
// without prefix, except where said):
//
//	jobthrottle_requests_total{key,result,reason}    calls that asked for permits (or a lease)
//	jobthrottle_permits_total{key,result,reason}     permits in them
//	jobthrottle_queue_wait_seconds{key}              histogram: time WaitN (or Acquire) slept for its permits
//	jobthrottle_degraded_total{key,policy}           decisions made without Redis (FailOpen, FailLocal)
//	jobthrottle_redis_errors_total{key}              failed Redis calls
//	jobthrottle_state_lost_total{key}                state found lost (Hooks.StateLost)
//	jobthrottle_leases_lost_total{key}               semaphore leases found lost
//	jobthrottle_pauses_total{key}                    pauses set by this process
//	jobthrottle_transport_pauses_total{host,status}  pauses the HTTP transport set on a 429/503
//	jobthrottle_transport_not_sent_total{host}       requests the transport gave up on before sending
//	jobthrottle_limits_drift_total{key}              other limits found on the key (Hooks.LimitsDrift)
//
// and, at scrape time, for each watched limiter (label limit: the limit's index in
// Limiter.Limits, "0" for the first: the limits of calls in the order given, then each
// unit's, by the unit's name; a unit's limit counts in its unit) and semaphore:
//
//	jobthrottle_limit_capacity{key,limit}            Rate (Burst for a token bucket)
//	jobthrottle_limit_used{key,limit}                permits of it taken (LimitState.Used)
//	jobthrottle_remaining{key}                       permits a call could take now
//	jobthrottle_booked{key}                          permits booked ahead (queue depth)
//	jobthrottle_booked_ahead_seconds{key}            time until the latest booking takes effect
//	jobthrottle_next_free_seconds{key}               time until one permit is free
//	jobthrottle_paused_seconds{key}                  time until a pause ends
//	jobthrottle_semaphore_leases{key}                live leases (active leases)
//	jobthrottle_semaphore_max{key}                   the semaphore's Max
//	jobthrottle_semaphore_waiting{key}               callers queued for a lease
//	jobthrottle_inspect_errors_total{key}            scrapes whose Inspect failed (no gauges then)
//
// and, for a watched limiter's own handle, its tenants' fair share (LimiterState.QueuedWeight
// and Tenants):
//
//	jobthrottle_tenants_queued_weight{key}           the weights of all the tenants queued, summed
//	jobthrottle_tenant_queued_seconds{key,tenant}    how far a tenant's place lies ahead of its turn
//	jobthrottle_tenant_weight{key,tenant}            the weight a tenant's requests were queued with
//
// A watched tenant's handle (Limiter.Tenant) gives the key's gauges above but
// next_free_seconds, which is the limiter's own handle's (a tenant's next permit waits for
// its caps and turn too), and its own part (LimiterState.Tenant) under its tenant label:
//
//	jobthrottle_tenant_next_free_seconds{key,tenant} time until one permit is free to the tenant
//	jobthrottle_tenant_queued_seconds{key,tenant}    its place, as above
//	jobthrottle_tenant_weight{key,tenant}            its handle's weight (the listing's, when it lists the tenant)
//	jobthrottle_tenant_cap_capacity{key,tenant,limit} its cap's Rate (Burst for a token bucket)
//	jobthrottle_tenant_cap_used{key,tenant,limit}    permits of its cap taken
//
// reason says what denied a request (result "limited"; "" for the other results):
// "limit", the limiter's limits (or a semaphore's Max, or a pause); on a tenant's handle
// (Limiter.Tenant), "cap", the tenant's own caps, or "turn", its fair turn had not come
// (Result.ByCap, Result.Turn). A tenant's Wait asks again when its turn comes, so each
// of its asks before then counts as limited with reason "turn", and its grant as
// acquired. The counters have no tenant label.
//
// jobthrottle_limits_drift_total moves once in each process for each new set of limits
// that process finds another process enforcing on the key (a rolling deploy that changes
// them, or two deployments that disagree: each enforces its own, so the key's limit is
// neither). It says when a disagreement began, not that it lasts: `jobthrottle show`
// shows both sets while it does. docs/operating.md has an alert on it.
//
// A queued tenant gets about its weight / queued weight of the rate. The tenant gauges
// cover the tenants Inspect lists, the 10 with the most queued, and the watched tenants'
// handles, and are made afresh at each scrape: a tenant that leaves the 10, or the queue,
// has no series from then on unless its handle is watched.
//
// Cardinality: the key label takes at most MaxKeys values (1000 by default, see
// WithMaxKeys); further keys are counted under key="_other" and get no gauges. Keys
// by the million therefore cost at most MaxKeys series per metric; the tenant label
// at most 10 values per watched key, and one per watched tenant's handle. host is bounded by the hosts the client calls.
// Label values that are not UTF-8 (keys and tenants' names may be any bytes) have
// each bad byte sequence replaced by U+FFFD.
//
// A Collector is safe for simultaneous use.
type Collector struct {
	maxKeys int
	timeout time.Duration

	requests, permits *prometheus.CounterVec
	wait              *prometheus.HistogramVec
	degraded          *prometheus.CounterVec
	redisErrors       *prometheus.CounterVec
	stateLost         *prometheus.CounterVec
	leasesLost        *prometheus.CounterVec
	pauses            *prometheus.CounterVec
	transportPauses   *prometheus.CounterVec
	notSent           *prometheus.CounterVec
	drift             *prometheus.CounterVec
	inspectErrors     *prometheus.CounterVec

	capacity, used, remaining, booked, bookedAhead, nextFree, paused *prometheus.Desc
	leases, semMax, waiting                                          *prometheus.Desc
	queuedWeight, tenantQueued, tenantWeight                         *prometheus.Desc
	tenantNextFree, capCapacity, capUsed                             *prometheus.Desc

	mu   sync.Mutex
	keys map[string]struct{} // key label values in use
	lims map[*throttle.Limiter]struct{}
	sems map[*throttle.Semaphore]struct{}
}

// Option configures a Collector.
type Option func(*Collector)

// WithMaxKeys sets how many distinct keys get a key label of their own; later keys
// share key="_other". If unset, zero or negative, it is 1000.
func WithMaxKeys(n int) Option { return func(c *Collector) { c.maxKeys = n } }

// WithInspectTimeout bounds the Inspect calls of one scrape. If unset, zero or
// negative, it is 5 seconds.
func WithInspectTimeout(d time.Duration) Option { return func(c *Collector) { c.timeout = d } }

// New returns a Collector; register it with a prometheus.Registerer.
func New(opts ...Option) *Collector {
	c := &Collector{keys: map[string]struct{}{}, lims: map[*throttle.Limiter]struct{}{},
		sems: map[*throttle.Semaphore]struct{}{}}
	for _, o := range opts {
		o(c)
	}
	if c.maxKeys <= 0 {
		c.maxKeys = 1000
	}
	if c.timeout <= 0 {
		c.timeout = 5 * time.Second
	}
	counter, histogram, gauge := vec.Counter, vec.Histogram, vec.Desc
	c.requests = counter("requests_total", "Calls that asked for permits or a lease, by outcome (acquired, limited, canceled) and what denied them (limit, cap, turn).", "key", "result", "reason")
	c.permits = counter("permits_total", "Permits asked for, by outcome (acquired, limited, canceled) and what denied them (limit, cap, turn).", "key", "result", "reason")
	c.wait = histogram("queue_wait_seconds", "Time WaitN or Acquire slept for its permits or lease.", "key")
	c.degraded = counter("degraded_total", "Decisions made without Redis by the failure policy.", "key", "policy")
	c.redisErrors = counter("redis_errors_total", "Failed Redis calls.", "key")
	c.stateLost = counter("state_lost_total", "Grants that found the key's state lost (evicted, deleted, failover).", "key")
	c.leasesLost = counter("leases_lost_total", "Semaphore leases found lost (expired before Extend or Release, or Hold could not renew).", "key")
	c.pauses = counter("pauses_total", "Pauses set on the key by this process.", "key")
	c.transportPauses = counter("transport_pauses_total", "Pauses the HTTP transport set on a 429 or 503 with Retry-After.", "host", "status")
	c.notSent = counter("transport_not_sent_total", "Requests the HTTP transport gave up on before sending them.", "host")
	c.drift = counter("limits_drift_total", "Sets of other limits this process found another process enforcing on the key.", "key")
	c.inspectErrors = counter("inspect_errors_total", "Scrapes whose Inspect of a watched key failed.", "key")
	c.capacity = gauge("limit_capacity", "The limit's Rate (Burst for a token bucket), at scrape time.", "key", "limit")
	c.used = gauge("limit_used", "Permits of the limit taken, bookings included, at scrape time.", "key", "limit")
	c.remaining = gauge("remaining", "Permits a call could take now.", "key")
	c.booked = gauge("booked", "Permits booked to take effect later (the queue's depth).", "key")
	c.bookedAhead = gauge("booked_ahead_seconds", "Time until the latest booking takes effect.", "key")
	c.nextFree = gauge("next_free_seconds", "Time until one permit is free.", "key")
	c.paused = gauge("paused_seconds", "Time until a pause on the key ends.", "key")
	c.leases = gauge("semaphore_leases", "Live leases of the semaphore (active leases).", "key")
	c.semMax = gauge("semaphore_max", "The semaphore's Max.", "key")
	c.waiting = gauge("semaphore_waiting", "Callers queued for a lease.", "key")
	c.queuedWeight = gauge("tenants_queued_weight", "The weights of all the tenants with requests queued in the fair share, summed.", "key")
	c.tenantQueued = gauge("tenant_queued_seconds", "How far the tenant's place in the fair share lies ahead of its turn, for the 10 tenants with the most queued and each watched tenant's handle.", "key", "tenant")
	c.tenantWeight = gauge("tenant_weight", "The weight the tenant's requests were queued with, for the 10 tenants with the most queued and each watched tenant's handle.", "key", "tenant")
	c.tenantNextFree = gauge("tenant_next_free_seconds", "Time until one permit is free to the tenant of a watched tenant's handle, its caps and turn counted.", "key", "tenant")
	c.capCapacity = gauge("tenant_cap_capacity", "The tenant's cap's Rate (Burst for a token bucket), for a watched tenant's handle.", "key", "tenant", "limit")
	c.capUsed = gauge("tenant_cap_used", "Permits of the tenant's cap taken, for a watched tenant's handle.", "key", "tenant", "limit")
	return c
}

// labelValue returns s as a label value: valid UTF-8, as Prometheus requires.
func labelValue(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// label returns key as a label value, or OtherKey once MaxKeys other keys have a label.
func (c *Collector) label(key string) string {
	key = labelValue(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.keys[key]; ok {
		return key
	}
	if len(c.keys) >= c.maxKeys {
		return OtherKey
	}
	c.keys[key] = struct{}{}
	return key
}

func (c *Collector) vecs() []prometheus.Collector {
	return []prometheus.Collector{c.requests, c.permits, c.wait, c.degraded, c.redisErrors, c.stateLost, c.leasesLost, c.pauses,
		c.transportPauses, c.notSent, c.drift, c.inspectErrors}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs() {
		v.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{c.capacity, c.used, c.remaining, c.booked, c.bookedAhead, c.nextFree, c.paused,
		c.leases, c.semMax, c.waiting, c.queuedWeight, c.tenantQueued, c.tenantWeight, c.tenantNextFree, c.capCapacity, c.capUsed} {
		ch <- d
	}
}
