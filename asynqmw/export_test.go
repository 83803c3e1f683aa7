package asynqmw

// Options of the tests: see inlineWait and handlerTime.
var (
	InlineWait  = inlineWait
	HandlerTime = handlerTime
)
