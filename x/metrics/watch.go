package metrics

import (
	"context"
	"strconv"
	"sync"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/prometheus/client_golang/prometheus"
)

// Watch adds limiters whose live state each scrape reads (Limiter.Inspect, all at once:
// the calls share round trips; bounded by WithInspectTimeout). Watch a limiter's own
// handle for its tenants' gauges: a tenant's handle's Inspect does not list them. A
// tenant's handle adds its own part under its tenant label (see Collector).
func (c *Collector) Watch(lims ...*throttle.Limiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range lims {
		c.lims[l] = struct{}{}
	}
}

// Unwatch removes limiters given to Watch.
func (c *Collector) Unwatch(lims ...*throttle.Limiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range lims {
		delete(c.lims, l)
	}
}

// WatchSemaphore adds semaphores whose live state each scrape reads.
func (c *Collector) WatchSemaphore(sems ...*throttle.Semaphore) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range sems {
		c.sems[s] = struct{}{}
	}
}

// UnwatchSemaphore removes semaphores given to WatchSemaphore.
func (c *Collector) UnwatchSemaphore(sems ...*throttle.Semaphore) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range sems {
		delete(c.sems, s)
	}
}

// Collect implements prometheus.Collector: the counters, then the live gauges of the
// watched limiters and semaphores, read with Inspect. The gauges are made afresh at
// each scrape, so a series whose key or tenant Inspect no longer reports is gone.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	lims := make([]*throttle.Limiter, 0, len(c.lims))
	for l := range c.lims {
		lims = append(lims, l)
	}
	sems := make([]*throttle.Semaphore, 0, len(c.sems))
	for s := range c.sems {
		sems = append(sems, s)
	}
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	type series struct {
		d      *prometheus.Desc
		labels [3]string // key, then limit or tenant, then a tenant's cap ("" for gauges without)
	}
	seen := map[series]bool{} // sent this scrape
	send := func(d *prometheus.Desc, v float64, labels ...string) {
		id := series{d: d}
		copy(id.labels[:], labels)
		if !seen[id] { // two Limiters of one key, or a Semaphore on a Limiter's key
			seen[id] = true
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
	}
	states, errs := make([]throttle.LimiterState, len(lims)), make([]error, len(lims))
	var wg sync.WaitGroup
	for i, l := range lims { // at once: the calls of one Redis client share round trips
		wg.Add(1)
		go func() {
			defer wg.Done()
			states[i], errs[i] = l.Inspect(ctx)
		}()
	}
	wg.Wait()
	// the limiters' own handles first: their figures are the key's, and their listing of
	// the tenants is what a tenant's handle adds to only for a tenant it does not list
	for _, own := range []bool{true, false} {
		for i, l := range lims {
			if (states[i].Tenant == nil) != own { // (a failed Inspect's state is zero: counted once)
				continue
			}
			k := c.label(l.Key())
			if errs[i] != nil {
				c.inspectErrors.WithLabelValues(k).Inc()
				continue
			}
			if k == OtherKey {
				continue // gauges of several keys cannot share one series
			}
			st := states[i]
			send(c.remaining, float64(st.Remaining), k)
			send(c.booked, float64(st.Booked), k)
			send(c.bookedAhead, st.BookedAhead.Seconds(), k)
			send(c.paused, st.PausedFor.Seconds(), k)
			for j, ls := range st.Limits {
				send(c.capacity, float64(ls.Capacity), k, strconv.Itoa(j))
				send(c.used, float64(ls.Used), k, strconv.Itoa(j))
			}
			if ts := st.Tenant; ts != nil { // a tenant's handle: its next permit, place and caps are its own
				name := labelValue(ts.Name)
				send(c.tenantNextFree, st.NextFree.Seconds(), k, name)
				send(c.tenantQueued, ts.Queued.Seconds(), k, name)
				send(c.tenantWeight, ts.Weight, k, name)
				for j, cs := range ts.Caps {
					send(c.capCapacity, float64(cs.Capacity), k, name, strconv.Itoa(j))
					send(c.capUsed, float64(cs.Used), k, name, strconv.Itoa(j))
				}
				continue
			}
			send(c.nextFree, st.NextFree.Seconds(), k)
			send(c.queuedWeight, st.QueuedWeight, k) // its tenants' fair share
			for _, ts := range st.Tenants {
				name := labelValue(ts.Name)
				send(c.tenantQueued, ts.Queued.Seconds(), k, name)
				send(c.tenantWeight, ts.Weight, k, name)
			}
		}
	}
	for _, s := range sems {
		st, err := s.Inspect(ctx)
		k := c.label(s.Key())
		if err != nil {
			c.inspectErrors.WithLabelValues(k).Inc()
			continue
		}
		if k == OtherKey {
			continue
		}
		send(c.leases, float64(st.Held), k)
		send(c.semMax, float64(st.Max), k)
		send(c.waiting, float64(st.Waiting), k)
		send(c.paused, st.PausedFor.Seconds(), k)
	}
	for _, v := range c.vecs() {
		v.Collect(ch)
	}
}
