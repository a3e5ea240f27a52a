package consumer

import "time"

// RetryPolicy says how a message whose handler failed with an error that
// could pass (a timeout, a partner that is down) is tried again. Failures
// of the database itself (lost connections, serialization failures,
// deadlocks) are retried without limit and count against none of it.
//
// Retry in one layer only: if the handler already retries a call
// internally, keep MaxAttempts low, or the attempts multiply.
type RetryPolicy struct {
	// MaxAttempts is how many times the handler may fail on one message
	// before the message is set aside by Config.OnPermanentFailure.
	// Attempts are counted in Postgres before each retry runs, so they
	// survive restarts: a message that crashes the process every time is
	// set aside too. Defaults to DefaultMaxAttempts; 1 means no retries.
	MaxAttempts int

	// InitialInterval and MaxInterval shape the wait before each retry:
	// random between zero and min(MaxInterval, InitialInterval·2^n) ("full
	// jitter", so that many workers failing together do not retry
	// together). Waits end at once on shutdown or revocation. Defaults:
	// DefaultRetryInitialInterval, DefaultRetryMaxInterval. The same waits
	// space the retries of a database that is down.
	InitialInterval time.Duration
	MaxInterval     time.Duration

	// MaxElapsed bounds the time from a message's first attempt to the
	// start of its last one: a message still failing after it is set aside
	// even if attempts remain. It guards against a large MaxAttempts
	// retrying for hours by accident. Defaults to DefaultRetryMaxElapsed.
	MaxElapsed time.Duration
}
