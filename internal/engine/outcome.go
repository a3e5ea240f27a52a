package engine

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// txOutcome is the result of one transaction.
type txOutcome struct {
	kind outcomeKind
	// committed counts the items committed: all of the plan on success, a
	// prefix when a savepoint transaction was cut short, else 0.
	committed int
	// err says why the transaction did not commit all of the plan; nil
	// when kind is succeeded.
	err error
	// failedAt is the index of the message that failed (kind
	// messageFailed), fail its failure.
	failedAt int
	fail     *failure
	// held is how long a serialized transaction held the consumer's gate.
	held time.Duration
	// st is the attempt's scratch space, with the fates of the messages,
	// when the attempt was not abandoned.
	st *batchState
}

// outcomeKind is what a transaction came to, and so what the partition
// does next.
type outcomeKind uint8

const (
	// succeeded means the whole plan committed.
	succeeded outcomeKind = iota
	// messageFailed means the message at failedAt failed; what came before it
	// may have committed (a savepoint transaction cut short).
	messageFailed
	// txFailed means the transaction failed as a whole, not for any message
	// (the infrastructure): it runs again after a backoff.
	txFailed
	// lostRace means the transaction lost a race for rows to another one (see
	// isContention), which is nobody's fault: it runs again soon, over
	// fewer messages.
	lostRace
	// gateBusy means it gave up waiting for the consumer's gate; nothing ran,
	// and the next one races.
	gateBusy
	// isolate means a BatchHandler call over several messages failed; the
	// transaction runs again with one message per call.
	isolate
	// oneByOne means the server refused the COMMIT of several messages for
	// their content (a deferred constraint); which message is at fault
	// only a transaction per message can tell.
	oneByOne
	// positionLost means the stored position is behind what this worker
	// committed; err is the *positionLostError, and the partition's run
	// ends.
	positionLost
	// stopped means the partition must stop; err is the *PartitionError that
	// says why.
	stopped
)

// infra is the outcome of a transaction that failed as a whole, not for
// any message: it runs again.
func infra(err error) txOutcome {
	kind := txFailed
	if isContention(err) {
		kind = lostRace
	}
	return txOutcome{kind: kind, err: err, fail: newFailure(classInfra, "", err)}
}

// failedMessage is the outcome of a transaction in which the message at i
// failed with f.
func failedMessage(i int, err error, f *failure) txOutcome {
	return txOutcome{kind: messageFailed, failedAt: i, err: err, fail: f}
}

// commitUnknown is the outcome of a COMMIT that got no answer: it may or
// may not have been applied. Never guess (pgconn.SafeToRetry says nothing
// about a COMMIT that was sent): leave the Kafka offset alone and run the
// batch again on a new connection, where the claims tell which it was.
func (a *txAttempt) commitUnknown(err error) txOutcome {
	a.log.Warn("COMMIT outcome unknown; the batch will run again and its claims decide", a.logAttrs(
		slog.Int64("offset", a.items[0].msg.Offset), slog.String("error", err.Error()))...)
	return infra(fmt.Errorf("commit outcome unknown: %w", err))
}

// commitRefused is the outcome of a COMMIT the server refused. A
// serialisation failure is the database's; anything else was caused by
// what the handlers wrote (a deferred constraint checked at COMMIT), or by
// the consumer's own rows when the transaction applies no message.
func (a *txAttempt) commitRefused(h *handled, err error) txOutcome {
	return a.handlersFailed(h, fmt.Errorf("commit refused: %w", err))
}

// txEnded is the outcome of a transaction that a statement of the
// handlers' ended (a COMMIT, refused with the rollback of all of it, or a
// ROLLBACK), found by the batch's closing or its COMMIT (see
// positions.QueueOpen). Nothing of the batch is durable: the handler that
// did it failed, a misuse to set aside. When the statement was queued,
// the Batch's messages are tried one per call; otherwise one per
// transaction (a handler whose COMMIT or ROLLBACK left the connection
// outside any transaction is caught after its call instead).
func (a *txAttempt) txEnded(h *handled, err error) txOutcome {
	err = fmt.Errorf("%w (%w)", kafkaoncetype.ErrTxEnded, err)
	if h.batch != nil {
		return a.batchFailed(h.batch, err)
	}
	return a.handlersFailed(h, err)
}

// sessionChanged is the outcome of a transaction whose handlers left the
// session unfit for the consumer's statements (see schema.AfterUserCode),
// found when they were done: nothing of it is durable, and the handler
// that did it failed, a misuse to set aside, found as for txEnded.
func (a *txAttempt) sessionChanged(h *handled, err error) txOutcome {
	err = fmt.Errorf("%w (%w)", kafkaoncetype.ErrSessionChanged, err)
	if h.batch != nil {
		return a.batchFailed(h.batch, err)
	}
	return a.handlersFailed(h, err)
}

// handlersFailed is the outcome of a transaction that what its handlers
// did made fail, at the end, when it can no longer tell which of them:
// with one message that message failed, with several a transaction per
// message tells which. A failure of the database's is retried. When the
// transaction applies no message (it only sets messages aside, or skips
// duplicates), it commits nothing a handler wrote (a handler whose
// message was set aside in a savepoint had its writes rolled back with
// it): the refusal is of the consumer's own rows, and blaming a message
// would set it aside in a transaction refused the same way, again and
// again.
func (a *txAttempt) handlersFailed(h *handled, err error) txOutcome {
	f := a.classify(err)
	switch {
	case f.class == classInfra:
		return infra(err)
	case !slices.Contains(a.st.fates[:h.end], fateApplied):
		return a.ownStatementFailed(err)
	case h.end == 1:
		merr, f := a.messageFailure(&a.items[0].msg, err)
		return failedMessage(0, merr, f)
	}
	return txOutcome{kind: oneByOne, err: fmt.Errorf("the %d messages at offsets %d to %d: %w; applying them one per transaction",
		h.end, a.items[0].msg.Offset, a.items[h.end-1].msg.Offset, err)}
}

// ownStatementFailed is the outcome of a failure of one of the
// consumer's own closing statements (the position, dead letters, claims'
// status). The database's failures are retried. Data it refuses (a value
// out of range, a constraint of the table's) it would refuse again on
// every retry, stalling the partition without a word: the partition
// stops instead, saying why.
func (a *txAttempt) ownStatementFailed(err error) txOutcome {
	if !isPermanentSQLError(err) {
		return infra(fmt.Errorf("record position: %w", err))
	}
	return txOutcome{kind: stopped, err: &kafkaoncetype.PartitionError{Topic: a.topic, Partition: a.partition,
		Err: fmt.Errorf("the consumer's own statements closing the batch at offsets %d to %d were refused, and would be again: %w",
			a.items[0].msg.Offset, a.items[len(a.items)-1].msg.Offset, err)}}
}

// batchFailed is the outcome of a BatchHandler call (or of its queued
// statements) that failed. With one message the failure is that message's;
// with more, the transaction is run again with one message per call.
func (a *txAttempt) batchFailed(b *Batch, err error) txOutcome {
	if len(b.Messages) == 1 {
		i := b.index[0]
		merr, f := a.messageFailure(&a.items[i].msg, err)
		if f.class == classInfra {
			return infra(merr)
		}
		return failedMessage(i, merr, f)
	}
	f := a.classify(err)
	if f.class == classInfra {
		return infra(err)
	}
	first, last := a.items[b.index[0]].msg.Offset, a.items[b.index[len(b.index)-1]].msg.Offset
	return txOutcome{kind: isolate,
		err: fmt.Errorf("batch handler failed for the %d messages at offsets %d to %d; handling them one at a time: %w", len(b.Messages), first, last, err)}
}

func invalidIDFailure(err error) *failure {
	return newFailure(classPermanent, deadletter.ClassInvalidID, err)
}
