package consumer

import (
	"time"

	"github.com/kafkaonce/kafkaonce/internal/later"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// RetryPolicy says how a message whose handler failed with an error that
// could pass (a timeout, a partner that is down) is tried again: see
// kafkaoncetype.RetryPolicy. Failures of the database itself are retried
// without limit and count against none of it.
type RetryPolicy = kafkaoncetype.RetryPolicy

// RetryLaterPolicy sets a failing message aside, to be tried again later by
// the consumer itself, instead of retrying it in place while its partition
// waits: see kafkaoncetype.RetryLaterPolicy and docs/failures.md. It gives
// up order for the messages it sets aside.
type RetryLaterPolicy = kafkaoncetype.RetryLaterPolicy

// Defaults of RetryLaterPolicy.
const (
	DefaultRetryLaterMaxRetries = kafkaoncetype.DefaultRetryLaterMaxRetries
	DefaultRetryLaterMaxDelay   = kafkaoncetype.DefaultRetryLaterMaxDelay
)

// RetryLater marks err as a failure to retry after d, without holding the
// partition meanwhile: the message is set aside (a dead letter of class
// retry_later) in the transaction that moves the partition past it, and
// the consumer's maintenance redrives it when it is due, as
// Config.RetryLater says. Order is given up for that message: see
// RetryLaterPolicy for who must not. RetryLater(nil, d) is nil. A handler
// that calls a partner sends the message id as the partner's idempotency
// key (docs/failures.md, "A flaky partner"):
//
//	if resp.StatusCode == http.StatusServiceUnavailable {
//		return consumer.RetryLater(errors.New("mail partner unavailable"), time.Minute)
//	}
func RetryLater(err error, d time.Duration) error { return later.Mark(err, d) }

// IsRetryLater reports whether the consumer sets a message aside to retry
// it later when its handler returns err: err, or an error it wraps, was
// marked by RetryLater, and nothing makes it permanent (IsPermanent wins:
// the message is set aside for good). It says what the error asks for; a
// consumer with OnPermanentFailure StopPartition retries it in place all
// the same. A handler's test asks it of the error consumertest.Handle
// returns:
//
//	err := consumertest.Handle(ctx, t, tx, handler, msg)
//	require.True(t, consumer.IsRetryLater(err))
func IsRetryLater(err error) bool {
	_, marked := later.After(err)
	return marked && !IsPermanent(err)
}
