package kafkaoncetype

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
	// before the message is set aside by the consumer's OnPermanentFailure.
	// Attempts are counted in Postgres before each retry runs, so they
	// survive restarts: a message that crashes the process every time is
	// set aside too. Defaults to consumer.DefaultMaxAttempts; 1 means no retries.
	MaxAttempts int

	// InitialInterval and MaxInterval shape the wait before each retry:
	// random between zero and min(MaxInterval, InitialInterval·2^n) ("full
	// jitter", so that many workers failing together do not retry
	// together). Waits end at once on shutdown or revocation. Defaults:
	// consumer.DefaultRetryInitialInterval, consumer.DefaultRetryMaxInterval. The same waits
	// space the retries of a database that is down.
	InitialInterval time.Duration
	MaxInterval     time.Duration

	// MaxElapsed bounds the time from a message's first attempt to the
	// start of its last one: a message still failing after it is set aside
	// even if attempts remain. It guards against a large MaxAttempts
	// retrying for hours by accident. Defaults to consumer.DefaultRetryMaxElapsed.
	MaxElapsed time.Duration
}

// RetryLaterPolicy sets a failing message aside, to be tried again later by
// the consumer itself, instead of retrying it in place while its partition
// waits (see consumer.RetryLater and docs/failures.md). The message is set aside as
// a dead letter of class retry_later, in the transaction that moves the
// partition past it, so the messages after it go on; the consumer's
// maintenance redrives it once due (its id claimed again, so it is applied
// once), backing off between retries, and after MaxRetries failed retries
// (or MaxElapsed after its first failure) leaves it an ordinary dead
// letter (class retries_exhausted) for an operator.
//
// It gives up order: a message retried later is applied after messages
// that came after it, on its partition and for its key. A ledger, or any
// handler whose effects depend on the order of a key's messages, must not
// use it; a notification or a call to a partner whose requests stand alone
// may. It needs OnPermanentFailure DeadLetter: a consumer that stops its
// partition instead sets nothing aside.
type RetryLaterPolicy struct {
	// After, when set, sets aside every message whose handler fails with
	// an error that could pass (one the consumer would retry in place), to
	// be retried this long after. Zero leaves such failures to Retry, and
	// only errors marked by consumer.RetryLater are set aside for later.
	After time.Duration
	// MaxRetries bounds the retries of a message set aside for later.
	// Defaults to DefaultRetryLaterMaxRetries, or to no bound when
	// MaxElapsed is set.
	MaxRetries int
	// MaxElapsed, when set, bounds the retries by time instead: a message
	// is retried until MaxElapsed after its first failure (the last retry
	// is due then at the latest), however many retries that takes, so an
	// outage of the partner is outlasted whatever the backoff. With
	// MaxRetries set too, whichever ends first ends the retries.
	MaxElapsed time.Duration
	// MaxDelay caps the wait between retries, which doubles after each
	// failed one (with jitter), unless the failed retry returned
	// consumer.RetryLater(err, d): it then waits d. Defaults to
	// DefaultRetryLaterMaxDelay.
	MaxDelay time.Duration
}

// Defaults of RetryLaterPolicy.
const (
	DefaultRetryLaterMaxRetries = 8
	DefaultRetryLaterMaxDelay   = time.Hour
)
