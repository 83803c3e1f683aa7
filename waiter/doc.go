// Package waiter waits for permits booked ahead: it sleeps until a reservation is due,
// honours the context and gives the booking back when the caller gives up.
//
// It knows nothing of Redis: it works with any Reserver, such as a *throttle.Limiter.
package waiter
