package kafkaoncetype

import (
	"errors"
	"fmt"
	"strconv"
)

// The causes the consumer reports, to be found with errors.Is in the
// errors of the hooks, the logs and Run.
var (
	// ErrInvalidMessageID says the message's id could not be derived, or is
	// empty, longer than MaxMessageIDLen, contains NUL or is not valid
	// UTF-8. Retrying cannot fix it: the message is set aside by the
	// consumer's OnPermanentFailure (a dead letter with class invalid_id,
	// or its partition stops at it under StopPartition).
	ErrInvalidMessageID = errors.New("invalid message id")

	// ErrFingerprintConflict says a message arrived with an id that was
	// already claimed for different content (key and value). That is a
	// producer bug (an id reused), not a duplicate, so the message is
	// neither applied nor skipped: it is set aside by OnPermanentFailure (a
	// dead letter with class conflict, or its partition stops at it), and
	// the conflict is reported to the fingerprint-conflict hook.
	ErrFingerprintConflict = errors.New("message id already claimed for different content")

	// ErrPositionAheadOfLog says the stored processed position of a
	// partition is beyond the end of its log, or the log under it changed:
	// it was truncated, or the broker lost records already handed out. It
	// is found at assignment, when a fetch is out of range, and while the
	// partition is idle. Consuming would silently skip the new messages
	// below the old position, so the partition stops instead.
	ErrPositionAheadOfLog = errors.New("stored position is beyond the end of the partition")

	// ErrTopicRecreated says the partition's topic is not the one its
	// stored position counts in: Kafka gave the topic another id, so it was
	// deleted and created again under the same name, and its offsets
	// started over with other messages. The id is kept with the position
	// in the database, so every member finds this before it reads, in any
	// process and after any restart, and while it runs (at a fetch, or
	// while the partition is idle). The partition stays stopped until an
	// operator moves its position: offsets.Store.Reset, or kafkaonce
	// topic-recreated for the whole topic (see docs/operations.md).
	ErrTopicRecreated = errors.New("the topic was deleted and created again since the stored position")

	// ErrTransactionalTopic says the partition stopped because the kafka-go
	// client was handed a transaction marker, the sign of a topic written
	// by transactional producers (Kafka Streams, Connect or Debezium with
	// exactly-once, Flink, any producer with a transactional id). kafka-go
	// hands out records of aborted transactions like any others, and
	// markers as messages, so the partition stops rather than apply what
	// was never committed; records of an aborted transaction before the
	// first marker may have been applied by then. The franz-go client (the
	// default) reads committed records only: switch to it.
	ErrTransactionalTopic = errors.New("the topic is written by transactional producers, which this Kafka client cannot read correctly")

	// ErrConsumerProtocolUnavailable says Run ended because the member
	// asked for the consumer group protocol (Config.GroupProtocol
	// ConsumerProtocol) and the cluster does not give it: a broker does
	// not serve ConsumerGroupHeartbeat v1 (Kafka before 4.0), or, once
	// the member joined, the group coordinator does not describe it as a
	// consumer-protocol member (a 4.x broker with "consumer" left out of
	// group.coordinator.rebalance.protocols). The member never falls
	// back to the classic protocol on its own; the error names what the
	// broker said.
	ErrConsumerProtocolUnavailable = errors.New("the consumer group protocol (KIP-848) is not available")

	// ErrMessagesDeleted says the partition's log no longer holds messages
	// this consumer has not processed yet (retention or a DeleteRecords
	// call removed them). They cannot be processed any more, and skipping
	// them silently would hide the loss, so the partition stops until an
	// operator moves its stored position past them.
	ErrMessagesDeleted = errors.New("messages were deleted from the log before they were processed")
)

// The handler's failures the consumer names, to be found with errors.Is.
var (
	// ErrTxControlledByConsumer is returned by the transaction a handler
	// gets when the handler calls Commit or Rollback: the consumer owns the
	// transaction's outcome.
	ErrTxControlledByConsumer = errors.New("the handler's transaction is committed or rolled back for the handler, not by it: return nil to commit, an error to roll back")

	// ErrTxCallOver is returned by every use of a handler's tx after its
	// call ended (it returned, or was abandoned after HandlerTimeout), and
	// of what it gave out (a savepoint, large objects): a goroutine the
	// handler left behind cannot write into a transaction it no longer
	// belongs to. tx.Conn() returns nil: the bare connection is not handed
	// out.
	ErrTxCallOver = errors.New("the handler's call is over (it returned, or was abandoned after HandlerTimeout): its transaction must not be used any more; do not keep tx or use it from goroutines that outlive the call")

	// ErrHandlerPanicked says the handler panicked. The panic value and
	// stack are in the wrapping MessageError's text and the log.
	ErrHandlerPanicked = errors.New("handler panicked")

	// ErrTxAborted says the handler returned nil, but a statement in its
	// transaction had failed, so the transaction was aborted and could not
	// have committed. A handler that ignores a SQL error is a bug; the
	// message is treated as failed (and retried) rather than skipped.
	ErrTxAborted = errors.New("the handler returned nil but its transaction is aborted: a SQL error was ignored")

	// ErrTxEnded says the consumer's transaction was no longer the one it
	// began when the handlers were done: a COMMIT or ROLLBACK the consumer
	// did not send ended it. Through tx, or queued, such a statement is
	// refused before it is sent (ErrTxControlledByConsumer); this is what
	// the database finds when one got past that all the same. Postgres
	// refuses such a COMMIT for the consumer (the transaction rolls back:
	// nothing of the batch becomes durable early), and the message is set
	// aside as for ErrTxControlledByConsumer, which it matches too.
	ErrTxEnded = fmt.Errorf("%w: it ended the transaction with a COMMIT or ROLLBACK statement", ErrTxControlledByConsumer)

	// ErrSessionChanged says a handler left its session unfit for the
	// consumer's own statements after it: a client_encoding other than
	// UTF8, a search_path that puts a schema before pg_catalog, a
	// session_replication_role other than origin,
	// standard_conforming_strings off, or another session user. The
	// database checks it once the handlers are done, and the transaction
	// rolls back; the message is set aside as for
	// ErrTxControlledByConsumer, which it matches too. SET LOCAL ROLE is
	// not one of these: the consumer's statements run as the role the
	// transaction began with.
	ErrSessionChanged = fmt.Errorf("%w: it changed a setting of the session the consumer's statements rely on", ErrTxControlledByConsumer)

	// ErrRowsLeftOpen says the handler returned with a query's rows still
	// open (rows.Close not called): the transaction's connection can run
	// nothing else. It is a bug of the handler's, so the message is set
	// aside at once, as for ErrTxControlledByConsumer.
	ErrRowsLeftOpen = errors.New("the handler returned with a query's rows still open: close rows (defer rows.Close()) before returning")

	// ErrHandlerTimeout says the handler ran longer than the consumer's
	// HandlerTimeout. Its context was cancelled; one that did not return
	// within a short grace after that was abandoned and its connection
	// closed, and its transaction and Batch refuse whatever it does later.
	ErrHandlerTimeout = errors.New("the handler exceeded HandlerTimeout")
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
	s := "consumer: message " + Position(e.Topic, e.Partition, e.Offset)
	if e.MessageID != "" {
		s += " (id " + strconv.Quote(e.MessageID) + ")"
	}
	return s + ": " + e.Err.Error()
}

func (e *MessageError) Unwrap() error { return e.Err }

// FingerprintConflictError describes the same message id seen with two
// different contents. It matches ErrFingerprintConflict with errors.Is.
type FingerprintConflictError struct {
	// Topic, Partition, Offset and MessageID locate the new message, and
	// Fingerprint is its content's.
	Topic       string
	Partition   int
	Offset      int64
	MessageID   string
	Fingerprint Fingerprint
	// Existing is the id's first use: the stored claim, or, when both
	// copies arrived in the same batch, the earlier copy (then its Status
	// is empty: nothing was stored).
	Existing Claim
}

func (e *FingerprintConflictError) Error() string {
	return fmt.Sprintf("consumer: message %s (id %q): %v: the id was first used by %s with fingerprint %s, this message has %s; fix the producer so that one id always means one content",
		Position(e.Topic, e.Partition, e.Offset), e.MessageID, ErrFingerprintConflict,
		Position(e.Existing.Topic, e.Existing.Partition, e.Existing.Offset),
		e.Existing.Fingerprint.String()[:16], e.Fingerprint.String()[:16])
}

func (e *FingerprintConflictError) Unwrap() error { return ErrFingerprintConflict }

// PartitionError says why a partition stopped. The consumer keeps the
// partition assigned but does not process it further until the group
// rebalances or the process restarts; nothing past the failing message is
// applied or committed. Err is a *MessageError, a
// *FingerprintConflictError, a *MessagesDeletedError,
// ErrPositionAheadOfLog, ErrTopicRecreated, ...
type PartitionError struct {
	Topic     string
	Partition int
	Err       error
}

func (e *PartitionError) Error() string {
	return "consumer: partition " + e.Topic + "/" + strconv.Itoa(e.Partition) + " stopped: " + e.Err.Error()
}

func (e *PartitionError) Unwrap() error { return e.Err }

// MessagesDeletedError says which messages of a partition were deleted from
// the log before this consumer processed them. It matches
// ErrMessagesDeleted with errors.Is, and comes wrapped in the PartitionError
// the partition stops with.
//
// It is found when a partition is assigned (the stored position is below
// the log start), and by every fetch: no client is trusted to hand out
// every offset, so the fetcher compares each offset fetched with the one it
// expects and looks into any gap (see docs/guarantee.md). A gap of offsets
// without a record (transaction markers, aborted records, compaction) is no
// loss and is passed; one that retention also reached before it was looked
// into is reported, as a loss cannot be ruled out.
type MessagesDeletedError struct {
	Topic     string
	Partition int
	// From and To are the first and the last offset deleted unprocessed.
	From, To int64
	// LogStart is where the log started when the loss was found: To+1.
	LogStart int64
}

func (e *MessagesDeletedError) Error() string {
	return fmt.Sprintf("%v: offsets %d to %d are gone (the log now starts at %d), most likely removed by retention while this consumer was behind; to accept the loss and go on, reset the stored position (offsets.Store.Reset) and the group offset to %d",
		ErrMessagesDeleted, e.From, e.To, e.LogStart, e.LogStart)
}

func (e *MessagesDeletedError) Unwrap() error { return ErrMessagesDeleted }
