package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// A Hook observes the consumer: metrics, tracing, alerting. A hook is any
// value that implements one or more of the Hook* interfaces below; pass
// hooks in Config.Hooks. New rejects a value that implements none of them.
//
// Hooks are called synchronously from the partition's worker goroutine, so
// they must be quick and must not block: a slow hook slows its partition.
// Hooks of different partitions are called concurrently.
type Hook = settings.Hook

// HookPartitionAssigned is called when this member starts processing a
// partition, after it decided where to start. ctx is the partition's: it is
// done once this member stops processing the partition (revoked in a
// rebalance, or the consumer stopping), so a hook that keeps it can tell
// whether the partition is still held.
type HookPartitionAssigned interface {
	OnPartitionAssigned(ctx context.Context, a PartitionAssignment)
}

// PartitionAssignment describes where a partition's processing starts.
type PartitionAssignment = kafkaoncetype.PartitionAssignment

// HookPartitionHeld is called when a transaction left open by a producer
// holds a partition back for Config.OpenTransactionAfter, and again
// (Released set) when it ends. The consumer reads committed records only,
// in offset order, so nothing at or after the open transaction's first
// record is processed meanwhile: a producer that died mid-transaction
// holds the partition until the broker aborts the transaction at its
// timeout (transaction.timeout.ms), and one whose transactions never end
// holds it for good. Only the franz-go client reports it.
type HookPartitionHeld interface {
	OnPartitionHeld(ctx context.Context, h PartitionHeld)
}

// PartitionHeld describes a partition held back by an open transaction.
type PartitionHeld = kafkaoncetype.PartitionHeld

// HookPartitionPaused is called when a pause comes to cover a partition
// of this member, and again (Resumed set) when it fetches again or this
// member stops processing it (revoked, or Run ending), so that a gauge fed
// by it falls back (see Consumer.Pause). It is called once the batch in progress, if any, has
// finished: from then on the partition fetches nothing and holds no
// transaction. A partition assigned while paused is reported at its
// assignment.
type HookPartitionPaused interface {
	OnPartitionPaused(ctx context.Context, p PartitionPaused)
}

// PartitionPaused describes a partition paused or resumed.
type PartitionPaused = kafkaoncetype.PartitionPaused

// HookPartitionLag is called when a partition's lag changes: its position
// moved (a batch committed, transaction markers or aborted records read
// past), or the consumer saw the log's end move (a fetch, or a look at an
// idle partition). Lag counts what the consumer has yet to apply, so it
// returns to 0 on an idle partition of a transactional topic, where the
// log's end lies past the last message (see PartitionLag). It is called
// after the database transaction that moved the position committed.
type HookPartitionLag interface {
	OnPartitionLag(ctx context.Context, l PartitionLag)
}

// PartitionLag describes a partition's lag.
type PartitionLag = kafkaoncetype.PartitionLag

// HookRetriesWaiting is called while the consumer runs, every 10 seconds
// or so, with how many of its messages set aside to be retried later
// (RetryLater, Config.RetryLater) wait for a retry, and when the first is
// due: a gauge apart from dead letters, which wait for an operator. The
// count is the consumer's, read from Postgres, so every running member
// reports the same number: aggregate it with max, not sum.
type HookRetriesWaiting interface {
	OnRetriesWaiting(ctx context.Context, w RetriesWaiting)
}

// RetriesWaiting counts a consumer's messages waiting to be retried.
type RetriesWaiting = kafkaoncetype.RetriesWaiting

// HookShareEvent is called, in a share group only, for what befalls a
// record there that a consumer group has no counterpart for: a delivery
// to this member (with its delivery count), a lock renewal refused, a record given up because its lock was lost, an accept
// or reject the broker did not take, a provisional dead letter written
// before a record's last delivery and removed once it is settled (see
// ShareEventKind). None breaks the guarantee, and each is logged; the
// hook makes them countable, so that an operator sees a group whose locks
// are too short for its handlers, or records whose last delivery did not
// finish.
type HookShareEvent interface {
	OnShareEvent(ctx context.Context, e ShareEvent)
}

// ShareEvent is what befell a share group's record.
type ShareEvent = kafkaoncetype.ShareEvent

// ShareEventKind says what befell a share group's record.
type ShareEventKind = kafkaoncetype.ShareEventKind

// What befell a share group's record (see package kafkaoncetype).
const (
	ShareDelivered          = kafkaoncetype.ShareDelivered
	ShareRenewalRefused     = kafkaoncetype.ShareRenewalRefused
	ShareLockLost           = kafkaoncetype.ShareLockLost
	ShareSettlementLost     = kafkaoncetype.ShareSettlementLost
	ShareProvisionalWritten = kafkaoncetype.ShareProvisionalWritten
	ShareProvisionalRemoved = kafkaoncetype.ShareProvisionalRemoved
)

// HookPartitionStopped is called when a partition stops because of a
// message that cannot be processed (err wraps a *MessageError or another
// cause; see PartitionError).
type HookPartitionStopped interface {
	OnPartitionStopped(ctx context.Context, err *PartitionError)
}

// HookBatchStart is called before each transaction of a batch. In a share
// group a batch is one poll's records of one partition, and its
// BatchInfo.HighWaterMark is -1 (a share member reads no log end).
type HookBatchStart interface {
	OnBatchStart(ctx context.Context, b BatchInfo)
}

// HookBatchEnd is called after each transaction of a batch: committed
// whole (r.Err nil), committed in part (r.Committed > 0 and r.Err says
// what stopped it), or not at all.
type HookBatchEnd interface {
	OnBatchEnd(ctx context.Context, b BatchInfo, r BatchResult)
}

// BatchInfo describes the messages of one batch transaction.
type BatchInfo = kafkaoncetype.BatchInfo

// HookContention is called when a batch transaction lost a race for rows
// to another transaction: a deadlock, a serialization failure or a lock
// timeout. It runs again shortly, with fewer messages; such retries are
// not attempts of any message and never set one aside. See "Hot rows" in
// docs/design.md.
type HookContention interface {
	OnContention(ctx context.Context, b BatchInfo, c Contention)
}

// Contention describes a transaction that lost a race for rows.
type Contention = kafkaoncetype.Contention

// BatchResult is the outcome of one batch transaction.
type BatchResult = kafkaoncetype.BatchResult

// HookMessageApplied is called for every message whose effects committed,
// after the commit.
type HookMessageApplied interface {
	OnMessageApplied(ctx context.Context, msg *Message)
}

// HookMessageSkipped is called for every message that was not handled
// because its id was already claimed with the same content, after the
// transaction that found it committed.
type HookMessageSkipped interface {
	OnMessageSkipped(ctx context.Context, msg *Message, reason SkipReason)
}

// SkipReason says why a message was skipped.
type SkipReason = kafkaoncetype.SkipReason

// Why a message was skipped (see package kafkaoncetype).
const (
	SkipAlreadyClaimed   = kafkaoncetype.SkipAlreadyClaimed
	SkipDuplicateInBatch = kafkaoncetype.SkipDuplicateInBatch
	SkipSuspectDuplicate = kafkaoncetype.SkipSuspectDuplicate
)

// HookSuspectDuplicate is called when a message's content was seen in the
// same partition within Config.SuspectDuplicateWindow under another id.
type HookSuspectDuplicate interface {
	OnSuspectDuplicate(ctx context.Context, msg *Message, first SuspectOf)
}

// SuspectOf is the earlier message a suspect duplicate looks like.
type SuspectOf = kafkaoncetype.SuspectOf

// HookHandlerEnd is called after every handler call, with its duration and
// error (nil on success). It runs while the transaction is open: keep it
// quick.
type HookHandlerEnd interface {
	OnHandlerEnd(ctx context.Context, msg *Message, d time.Duration, err error)
}

// HookMessageFailed is called for every failed attempt at a message: the
// handler returned an error (or panicked, or timed out), or the message
// could not be handled at all (an invalid id, a fingerprint conflict).
// Failures of the database itself, which are retried without counting, are
// not reported here but in HookBatchEnd.
type HookMessageFailed interface {
	OnMessageFailed(ctx context.Context, msg *Message, f Failure)
}

// Failure describes one failed attempt.
type Failure = kafkaoncetype.Failure

// HookMessageDeadLettered is called for every message set aside in the
// dead_letters table, after the transaction that did it committed: with
// class ClassRetryLater for one set aside to be retried later, and again,
// with the class it ends with (ClassRetriesExhausted, or a permanent
// failure's), when such a message's retries end without applying it and
// it waits for an operator from then on.
type HookMessageDeadLettered interface {
	OnMessageDeadLettered(ctx context.Context, msg *Message, l DeadLettered)
}

// DeadLettered summarises a message set aside.
type DeadLettered = kafkaoncetype.DeadLettered

// HookFingerprintConflict is called when a message's id was already used
// for different content.
type HookFingerprintConflict interface {
	OnFingerprintConflict(ctx context.Context, err *FingerprintConflictError)
}

// HookOffsetsCommitted is called after each offset commit to Kafka, with the
// committed offsets (the next offset to read, per partition) and the
// commit's error.
type HookOffsetsCommitted interface {
	OnOffsetsCommitted(ctx context.Context, offsets []TopicPartitionOffset, err error)
}

// TopicPartitionOffset is the next offset to read in one partition.
type TopicPartitionOffset = kafkaoncetype.TopicPartitionOffset

// HookBatchScope gives each batch transaction a context of the hook's
// making, for tracing: ScopeBatch is called before HookBatchStart with the
// transaction's messages, and the context it returns is the one the
// transaction, the handler and every hook called for the transaction get,
// up to HookBatchEnd and the per-message hooks of what it committed; end
// is called after those. Every transaction is a scope of its own: a batch
// that runs again after a failure opens another. Like every Message, msgs
// must not be kept after end returns.
//
// The returned context lends its values only (a span): its deadline and
// cancellation are ignored, the consumer's own decide, so that a hook can
// neither hold a handler past shutdown nor stop a batch. A nil context, or
// a panic in ScopeBatch or end, opens no scope and fails nothing.
type HookBatchScope interface {
	ScopeBatch(ctx context.Context, b BatchInfo, msgs []*Message) (_ context.Context, end func())
}

// HookHandlerScope gives each handler call for one message a context of
// the hook's making, for tracing: the handler gets the context ScopeHandler
// returns (its values, as for HookBatchScope), and end is called once with
// the call's error when it returns, or when the consumer abandons a call
// that hung past HandlerTimeout (the call may still return later). It
// covers Handler calls, BatchHandler calls for one message (after a
// failure, or from a savepoint on) and redrives; a BatchHandler call for
// several messages runs in the batch's scope (HookBatchScope) alone.
type HookHandlerScope interface {
	ScopeHandler(ctx context.Context, msg *Message) (_ context.Context, end func(err error))
}

// sortHooks passes the engine each of hs's hook methods, sorted by the
// interface they implement.
func sortHooks(hs []Hook) (engine.Hooks, error) {
	var out engine.Hooks
	for i, h := range hs {
		n := out.Len()
		if v, ok := h.(HookPartitionAssigned); ok {
			out.Assigned = append(out.Assigned, v.OnPartitionAssigned)
		}
		if v, ok := h.(HookPartitionStopped); ok {
			out.Stopped = append(out.Stopped, v.OnPartitionStopped)
		}
		if v, ok := h.(HookBatchStart); ok {
			out.Start = append(out.Start, v.OnBatchStart)
		}
		if v, ok := h.(HookBatchEnd); ok {
			out.End = append(out.End, v.OnBatchEnd)
		}
		if v, ok := h.(HookMessageApplied); ok {
			out.Applied = append(out.Applied, v.OnMessageApplied)
		}
		if v, ok := h.(HookMessageSkipped); ok {
			out.Skipped = append(out.Skipped, v.OnMessageSkipped)
		}
		if v, ok := h.(HookFingerprintConflict); ok {
			out.Conflict = append(out.Conflict, v.OnFingerprintConflict)
		}
		if v, ok := h.(HookOffsetsCommitted); ok {
			out.Committed = append(out.Committed, v.OnOffsetsCommitted)
		}
		if v, ok := h.(HookMessageFailed); ok {
			out.Failed = append(out.Failed, v.OnMessageFailed)
		}
		if v, ok := h.(HookMessageDeadLettered); ok {
			out.Dead = append(out.Dead, v.OnMessageDeadLettered)
		}
		if v, ok := h.(HookSuspectDuplicate); ok {
			out.Suspect = append(out.Suspect, v.OnSuspectDuplicate)
		}
		if v, ok := h.(HookHandlerEnd); ok {
			out.Handler = append(out.Handler, v.OnHandlerEnd)
		}
		if v, ok := h.(HookContention); ok {
			out.Contention = append(out.Contention, v.OnContention)
		}
		if v, ok := h.(HookPartitionHeld); ok {
			out.Held = append(out.Held, v.OnPartitionHeld)
		}
		if v, ok := h.(HookPartitionPaused); ok {
			out.Paused = append(out.Paused, v.OnPartitionPaused)
		}
		if v, ok := h.(HookPartitionLag); ok {
			out.Lag = append(out.Lag, v.OnPartitionLag)
		}
		if v, ok := h.(HookRetriesWaiting); ok {
			out.Waiting = append(out.Waiting, v.OnRetriesWaiting)
		}
		if v, ok := h.(HookShareEvent); ok {
			out.Share = append(out.Share, v.OnShareEvent)
		}
		if v, ok := h.(HookBatchScope); ok {
			out.BatchScope = append(out.BatchScope, v.ScopeBatch)
		}
		if v, ok := h.(HookHandlerScope); ok {
			out.HandlerScope = append(out.HandlerScope, v.ScopeHandler)
		}
		if out.Len() == n {
			return engine.Hooks{}, fmt.Errorf("consumer: Hooks[%d] (%T) implements no hook interface; see the Hook* interfaces in package consumer", i, h)
		}
	}
	return out, nil
}
