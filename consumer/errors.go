package consumer

import (
	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/internal/permanent"
)

var (
	// ErrInvalidMessageID: the message's id could not be derived, or is
	// empty, longer than MaxMessageIDLen, contains NUL or is not valid
	// UTF-8. Retrying cannot fix it: the message is set aside by
	// Config.OnPermanentFailure (a dead letter with class invalid_id, or
	// its partition stops at it under StopPartition).
	ErrInvalidMessageID = engine.ErrInvalidMessageID

	// ErrFingerprintConflict: a message arrived with an id that was already
	// claimed for different content (key and value). That is a producer bug
	// (an id reused), not a duplicate, so the message is neither applied nor
	// skipped: it is set aside by Config.OnPermanentFailure (a dead letter
	// with class conflict, or its partition stops at it under
	// StopPartition), and the conflict is reported through
	// HookFingerprintConflict.
	ErrFingerprintConflict = engine.ErrFingerprintConflict

	// ErrPositionAheadOfLog: the stored processed position of a partition is
	// beyond the end of its log, or the log under it changed: the topic was
	// deleted and re-created (franz-go sees its new id), truncated, or the
	// broker lost records already handed out. It is found at assignment,
	// when a fetch is out of range, and while the partition is idle.
	// Consuming would silently skip the new messages below the old
	// position, so the partition stops instead.
	ErrPositionAheadOfLog = engine.ErrPositionAheadOfLog

	// ErrTransactionalTopic: the partition stopped because the kafka-go
	// client (Config.KafkaClient KafkaGo) was handed a transaction marker,
	// the sign of a topic written by transactional producers (Kafka
	// Streams, Connect or Debezium with exactly-once, Flink, any producer
	// with a transactional id). kafka-go hands out records of aborted
	// transactions like any others, and markers as messages, so the
	// partition stops rather than apply what was never committed; records
	// of an aborted transaction before the first marker may have been
	// applied by then. The franz-go client (the default) reads committed
	// records only: switch to it.
	ErrTransactionalTopic = engine.ErrTransactionalTopic

	// ErrTxControlledByConsumer is returned by the transaction a Handler gets
	// when the handler calls Commit or Rollback: the consumer owns the
	// transaction's outcome.
	ErrTxControlledByConsumer = engine.ErrTxControlledByConsumer

	// ErrTxCallOver is returned by every use of a handler's tx after its
	// call ended (it returned, or was abandoned after HandlerTimeout): a
	// goroutine the handler left behind cannot write into a transaction it
	// no longer belongs to. (tx.Conn() returns the raw connection during
	// the call, which the guard cannot follow: do not keep it.)
	ErrTxCallOver = engine.ErrTxCallOver

	// ErrHandlerPanicked: the handler panicked. The panic value and stack
	// are in the wrapping MessageError's text and the log.
	ErrHandlerPanicked = engine.ErrHandlerPanicked
)

// MessageError is an error about one message. Errors the consumer reports
// through hooks and logs for a message are of this type; use errors.Is to
// find the cause (ErrInvalidMessageID, ErrFingerprintConflict, ...).
//
// Its fields are Topic, Partition and Offset (where the message is),
// MessageID (empty when the id could not be derived) and Err (the cause).
type MessageError = engine.MessageError

// FingerprintConflictError describes the same message id seen with two
// different contents. It matches ErrFingerprintConflict with errors.Is.
//
// Its fields: Topic, Partition, Offset and MessageID locate the new
// message, and Fingerprint is its content's; Existing (a dedupe.Record) is
// the id's first use: the stored claim or, when both copies arrived in the
// same batch, the earlier copy (then its Status is empty: nothing was
// stored).
type FingerprintConflictError = engine.FingerprintConflictError

// PartitionError says why a partition stopped. The consumer keeps the
// partition assigned but does not process it further until the group
// rebalances or the process restarts; nothing past the failing message is
// applied or committed.
//
// Its fields are Topic and Partition (the partition stopped) and Err (why:
// a *MessageError, a *FingerprintConflictError, a *MessagesDeletedError,
// ErrPositionAheadOfLog, ...).
type PartitionError = engine.PartitionError

var (
	// ErrTxAborted: the handler returned nil, but a statement in its
	// transaction had failed, so the transaction was aborted and could not
	// have committed. A handler that ignores a SQL error is a bug; the
	// message is treated as failed (and retried) rather than skipped.
	ErrTxAborted = engine.ErrTxAborted

	// ErrTxEnded: the handler ended the consumer's transaction with a
	// COMMIT or ROLLBACK statement sent on the bare connection
	// (tx.Conn()), which the guard around tx cannot see; through tx, or
	// queued, such a statement is refused (ErrTxControlledByConsumer). Postgres
	// refuses such a COMMIT for the consumer (the transaction rolls back:
	// nothing of the batch becomes durable early), and the message is set
	// aside as for ErrTxControlledByConsumer, which it matches too.
	ErrTxEnded = engine.ErrTxEnded

	// ErrRowsLeftOpen: the handler returned with a query's rows still open
	// (rows.Close not called): the transaction's connection can run nothing
	// else. It is a bug of the handler's, so the message is set aside at
	// once, as for ErrTxControlledByConsumer.
	ErrRowsLeftOpen = engine.ErrRowsLeftOpen

	// ErrHandlerTimeout: the handler ran longer than Config.HandlerTimeout.
	// Its context was cancelled; one that did not return within a short
	// grace after that was abandoned and its connection closed, and its
	// transaction and Batch refuse whatever it does later.
	ErrHandlerTimeout = engine.ErrHandlerTimeout
)

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

// ErrMessagesDeleted: the partition's log no longer holds messages this
// consumer has not processed yet (retention or a DeleteRecords call removed
// them). They cannot be processed any more, and skipping them silently
// would hide the loss, so the partition stops until an operator moves its
// stored position past them.
var ErrMessagesDeleted = engine.ErrMessagesDeleted

// MessagesDeletedError says which messages of a partition were deleted from
// the log before this consumer processed them. It matches
// ErrMessagesDeleted with errors.Is, and comes wrapped in the PartitionError
// the partition stops with (HookPartitionStopped).
//
// Its fields are Topic and Partition, From and To (the first and the last
// offset deleted unprocessed) and LogStart (where the log started when the
// loss was found: To+1).
//
// It is found when a partition is assigned (the stored position is below
// the log start), and by every fetch: no client is trusted to hand out
// every offset, so the fetcher compares each offset fetched with the one it
// expects and looks into any gap (see docs/guarantee.md). A gap of
// offsets without a record (transaction markers, aborted records,
// compaction) is no loss and is passed; one that retention also reached
// before it was looked into is reported, as a loss cannot be ruled out.
type MessagesDeletedError = engine.MessagesDeletedError
