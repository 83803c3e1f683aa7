package asynqmw

// Options of the tests: see inlineWait and handlerTime.
var (
	InlineWait  = inlineWait
	HandlerTime = handlerTime
)

// CopyOf is the header of a last attempt's copy.
const CopyOf = copyOf

// BookingID is the booking ID of a task of an ID in a queue.
var BookingID = bookingID
