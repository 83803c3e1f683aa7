package waiter

// WithTransportClock is withTransportClock for the tests of package waiter_test.
var WithTransportClock = withTransportClock
