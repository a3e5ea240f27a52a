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
	ErrTopicRecreated      = kafkaoncetype.ErrTopicRecreated
	ErrTransactionalTopic  = kafkaoncetype.ErrTransactionalTopic
	ErrMessagesDeleted     = kafkaoncetype.ErrMessagesDeleted

	ErrConsumerProtocolUnavailable = kafkaoncetype.ErrConsumerProtocolUnavailable
)

// The handler's failures the consumer names, found with errors.Is; each is
// documented in package kafkaoncetype.
var (
	ErrTxControlledByConsumer = kafkaoncetype.ErrTxControlledByConsumer
	ErrTxCallOver             = kafkaoncetype.ErrTxCallOver
	ErrHandlerPanicked        = kafkaoncetype.ErrHandlerPanicked
	ErrTxAborted              = kafkaoncetype.ErrTxAborted
	ErrTxEnded                = kafkaoncetype.ErrTxEnded
	ErrSessionChanged         = kafkaoncetype.ErrSessionChanged
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
// without retries, when its handler fails with err. It asks the consumer's
// own classification, so it cannot disagree with it: an error marked by
// Permanent (or outbox.Permanent), a panic (ErrHandlerPanicked), a misuse
// of the transaction (ErrTxControlledByConsumer, ErrTxEnded,
// ErrSessionChanged, ErrRowsLeftOpen), a payload encoding/json could not
// decode, and a Postgres error the same data would raise again are
// permanent;
// docs/failures.md lists every case, with the SQLSTATE classes. Any other
// error is retried alone, with backoff, up to Config.Retry.MaxAttempts; a
// failure of the database is retried without counting an attempt. Which
// of the two a network error is depends on the transaction's connection,
// not on the error, so IsPermanent is false for both.
//
// A handler's test asks it of the error consumertest.Handle returns:
//
//	err := consumertest.Handle(ctx, t, tx, handler, consumertest.NewMessage([]byte("not json")))
//	require.True(t, consumer.IsPermanent(err))
func IsPermanent(err error) bool { return engine.IsPermanent(err) }
