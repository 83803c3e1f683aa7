package rivermw

import "time"

// lateGrace bounds how long after its slot a job that comes back may still run on
// it (see Throttle): at most a quarter of the limit's shortest period. The pacer
// keeps each process's starts within the limit; across processes it widens the
// lag of one client's starts behind another's (the Δ of the pacer's fleet-wide
// bound) by up to this much.
const lateGrace = 250 * time.Millisecond
