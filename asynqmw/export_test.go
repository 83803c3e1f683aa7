package asynqmw

// Options of the tests: see inlineWait and handlerTime.
var (
	InlineWait  = inlineWait
	HandlerTime = handlerTime
)

// CopyOf is the header of a last attempt's copy.
const CopyOf = copyOf
