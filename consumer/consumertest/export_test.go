package consumertest

// HandleWithin is Handle with a handler timeout of the test's choosing, so
// that a test of the timeout need not wait DefaultHandlerTimeout.
var HandleWithin = handle
