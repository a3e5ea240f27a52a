package engine

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
)

var (
	// ErrInvalidMessageID: see consumer.ErrInvalidMessageID.
	ErrInvalidMessageID = errors.New("invalid message id")

	// ErrFingerprintConflict: a message arrived with an id that was already
	// claimed for different content (key and value). That is a producer bug
	// (an id reused), not a duplicate, so the message is neither applied nor
	// skipped: it is set aside by Config.OnPermanentFailure (a dead letter
	// with class conflict, or its partition stops at it under
	// StopPartition), and the conflict is reported through
	// HookFingerprintConflict.
	ErrFingerprintConflict = errors.New("message id already claimed for different content")

	// ErrPositionAheadOfLog: the stored processed position of a partition is
	// beyond the end of its log, which happens when a topic is deleted and
	// re-created (or truncated). Consuming would silently skip the new
	// messages below the old position, so the partition stops instead.
	ErrPositionAheadOfLog = errors.New("stored position is beyond the end of the partition")

	// ErrTransactionalTopic: see consumer.ErrTransactionalTopic.
	ErrTransactionalTopic = errors.New("the topic is written by transactional producers, which this Kafka client cannot read correctly")

	// ErrTxControlledByConsumer is returned by the transaction a Handler gets
	// when the handler calls Commit or Rollback: the consumer owns the
	// transaction's outcome.
	ErrTxControlledByConsumer = txguard.ErrTxControlled

	// ErrTxCallOver is returned by every use of a handler's tx after its
	// call ended (it returned, or was abandoned after HandlerTimeout): a
	// goroutine the handler left behind cannot write into a transaction it
	// no longer belongs to. (tx.Conn() returns the raw connection during
	// the call, which the guard cannot follow: do not keep it.)
	ErrTxCallOver = txguard.ErrCallOver

	// ErrHandlerPanicked: the handler panicked. The panic value and stack
	// are in the wrapping MessageError's text and the log.
	ErrHandlerPanicked = usercall.ErrPanicked
)

// MessageError is an error about one message. Errors the consumer reports
// through hooks and logs for a message are of this type; use errors.Is to
// find the cause (ErrInvalidMessageID, ErrFingerprintConflict, ...).
type MessageError struct {
	Topic     string
	Partition int
	Offset    int64
	// MessageID is empty when the id could not be derived.
	MessageID string
	Err       error
}

func (e *MessageError) Error() string {
	s := "consumer: message " + positionString(e.Topic, e.Partition, e.Offset)
	if e.MessageID != "" {
		s += " (id " + strconv.Quote(e.MessageID) + ")"
	}
	return s + ": " + e.Err.Error()
}

func (e *MessageError) Unwrap() error { return e.Err }

// FingerprintConflictError describes the same message id seen with two
// different contents. It matches ErrFingerprintConflict with errors.Is.
type FingerprintConflictError struct {
	// Topic, Partition, Offset and MessageID locate the new message.
	Topic       string
	Partition   int
	Offset      int64
	MessageID   string
	Fingerprint dedupe.Fingerprint
	// Existing is the id's first use: the stored claim, or, when both
	// copies arrived in the same batch, the earlier copy (then its Status
	// is empty: nothing was stored).
	Existing dedupe.Record
}

func (e *FingerprintConflictError) Error() string {
	return fmt.Sprintf("consumer: message %s (id %q): %v: the id was first used by %s with fingerprint %s, this message has %s; fix the producer so that one id always means one content",
		positionString(e.Topic, e.Partition, e.Offset), e.MessageID, ErrFingerprintConflict,
		positionString(e.Existing.Topic, e.Existing.Partition, e.Existing.Offset),
		short(e.Existing.Fingerprint), short(e.Fingerprint))
}

func (e *FingerprintConflictError) Unwrap() error { return ErrFingerprintConflict }

func short(f dedupe.Fingerprint) string { return f.String()[:16] }

// PartitionError says why a partition stopped. The consumer keeps the
// partition assigned but does not process it further until the group
// rebalances or the process restarts; nothing past the failing message is
// applied or committed.
type PartitionError struct {
	Topic     string
	Partition int
	Err       error
}

func (e *PartitionError) Error() string {
	return "consumer: partition " + e.Topic + "/" + strconv.Itoa(e.Partition) + " stopped: " + e.Err.Error()
}

func (e *PartitionError) Unwrap() error { return e.Err }

var (
	// ErrTxAborted: the handler returned nil, but a statement in its
	// transaction had failed, so the transaction was aborted and could not
	// have committed. A handler that ignores a SQL error is a bug; the
	// message is treated as failed (and retried) rather than skipped.
	ErrTxAborted = usercall.ErrTxAborted

	// ErrTxEnded: the handler ended the consumer's transaction with a
	// COMMIT or ROLLBACK statement sent on the bare connection
	// (tx.Conn()), which the guard around tx cannot see; through tx, or
	// queued, such a statement is refused (ErrTxControlledByConsumer). Postgres
	// refuses such a COMMIT for the consumer (the transaction rolls back:
	// nothing of the batch becomes durable early), and the message is set
	// aside as for ErrTxControlledByConsumer, which it matches too.
	ErrTxEnded = usercall.ErrTxEnded

	// ErrRowsLeftOpen: the handler returned with a query's rows still open
	// (rows.Close not called): the transaction's connection can run nothing
	// else. It is a bug of the handler's, so the message is set aside at
	// once, as for ErrTxControlledByConsumer.
	ErrRowsLeftOpen = usercall.ErrRowsLeftOpen

	// ErrHandlerTimeout: the handler ran longer than Config.HandlerTimeout.
	// Its context was cancelled; one that did not return within a short
	// grace after that was abandoned and its connection closed, and its
	// transaction and Batch refuse whatever it does later.
	ErrHandlerTimeout = usercall.ErrTimeout
)
