package consumer

import (
	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/internal/permanent"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// The causes the consumer reports, found with errors.Is; each is documented
// in package kafkaoncetype.
var (
	ErrInvalidMessageID    = kafkaoncetype.ErrInvalidMessageID
	ErrFingerprintConflict = kafkaoncetype.ErrFingerprintConflict
	ErrPositionAheadOfLog  = kafkaoncetype.ErrPositionAheadOfLog
	ErrTransactionalTopic  = kafkaoncetype.ErrTransactionalTopic
	ErrMessagesDeleted     = kafkaoncetype.ErrMessagesDeleted
)

// The handler's failures the consumer names, found with errors.Is; each is
// documented in package kafkaoncetype.
var (
	ErrTxControlledByConsumer = kafkaoncetype.ErrTxControlledByConsumer
	ErrTxCallOver             = kafkaoncetype.ErrTxCallOver
	ErrHandlerPanicked        = kafkaoncetype.ErrHandlerPanicked
	ErrTxAborted              = kafkaoncetype.ErrTxAborted
	ErrTxEnded                = kafkaoncetype.ErrTxEnded
	ErrRowsLeftOpen           = kafkaoncetype.ErrRowsLeftOpen
	ErrHandlerTimeout         = kafkaoncetype.ErrHandlerTimeout
)

// MessageError is an error about one message: the errors the consumer
// reports through hooks and logs for a message are of this type.
type MessageError = kafkaoncetype.MessageError

// FingerprintConflictError describes the same message id seen with two
// different contents. It matches ErrFingerprintConflict with errors.Is.
type FingerprintConflictError = kafkaoncetype.FingerprintConflictError

// PartitionError says why a partition stopped (HookPartitionStopped).
type PartitionError = kafkaoncetype.PartitionError

// MessagesDeletedError says which messages of a partition were deleted from
// the log before this consumer processed them. It matches
// ErrMessagesDeleted with errors.Is.
type MessagesDeletedError = kafkaoncetype.MessagesDeletedError

// Permanent marks err as a failure that retrying cannot fix (a payload that
// does not decode, a request the partner rejects as invalid): the message is
// set aside by Config.OnPermanentFailure at once, without retries.
//
//	if err := json.Unmarshal(msg.Value, &t); err != nil {
//		return consumer.Permanent(err)
//	}
//
// Permanent(nil) is nil. Permanent and outbox.Permanent are the same
// mark: an error marked by either is permanent to the consumer and to the
// outbox relay, so a handler may return an error that a delivery function
// marked, and the reverse.
func Permanent(err error) error { return permanent.Mark(err) }

// IsPermanent reports whether the consumer sets a message aside at once,
// without retries, when its handler fails with err: err, or an error it
// wraps, was marked by Permanent (or outbox.Permanent); it is a panic
// (ErrHandlerPanicked); a misuse of the transaction
// (ErrTxControlledByConsumer, ErrTxEnded, ErrRowsLeftOpen); a payload
// encoding/json could not decode (*json.SyntaxError,
// *json.UnmarshalTypeError); or a Postgres error that the same data would
// raise again (SQLSTATE class 22; class 23 but for 23503, a foreign key
// whose parent row may still arrive; class 54). It asks the consumer's own
// classification, so it cannot disagree with it. The message is then set
// aside by Config.OnPermanentFailure: a dead letter, or its partition stops.
//
// Any other error is retried: alone, with backoff, up to
// Config.Retry.MaxAttempts, then set aside as retries_exhausted (with
// MaxAttempts 1, after its one attempt). Failures of the database are
// retried without limit, counting no attempt: a serialization failure, a
// deadlock, a lock timeout, a session the server ended, and a network
// error (a net.Error, an EOF) that broke the connection of the message's
// transaction, as long as the handler wraps it with %w. The same network
// errors from the handler's own calls (an HTTP request refused or timed
// out, the deadline of a context of its own) are its failures, retried up to MaxAttempts, as are a timeout of the
// handler (ErrHandlerTimeout), ErrTxAborted and a plain error. Which of
// the two a network error is depends on the transaction's connection, not
// on the error, so IsPermanent, which answers only whether a message is
// set aside at once, is false for both.
//
// A handler's test asks it of the error consumertest.Handle returns, which
// turns panics, timeouts and misuses into their errors as the consumer
// does:
//
//	err := consumertest.Handle(ctx, t, tx, handler, consumertest.NewMessage([]byte("not json")))
//	require.True(t, consumer.IsPermanent(err))
func IsPermanent(err error) bool { return engine.IsPermanent(err) }
