package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/engine"
)

// A Hook observes the consumer: metrics, tracing, alerting. A hook is any
// value that implements one or more of the Hook* interfaces below; pass
// hooks in Config.Hooks. New rejects a value that implements none of them.
//
// Hooks are called synchronously from the partition's worker goroutine, so
// they must be quick and must not block: a slow hook slows its partition.
// Hooks of different partitions are called concurrently.
type Hook any

// HookPartitionAssigned is called when this member starts processing a
// partition, after it decided where to start. ctx is the partition's: it is
// done once this member stops processing the partition (revoked in a
// rebalance, or the consumer stopping), so a hook that keeps it can tell
// whether the partition is still held.
type HookPartitionAssigned interface {
	OnPartitionAssigned(ctx context.Context, a PartitionAssignment)
}

// PartitionAssignment describes where a partition's processing starts.
type PartitionAssignment struct {
	Topic     string
	Partition int
	// KafkaOffset is the group's committed offset, or -1 when there is none.
	KafkaOffset int64
	// StoredPosition is the processed position in Postgres, or -1 when
	// there is none.
	StoredPosition int64
	// LogStart and LogEnd are the first offset still in the log and the
	// offset the next produced message will get.
	LogStart, LogEnd int64
	// Start is the offset processing starts at.
	Start int64
}

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
type PartitionHeld struct {
	Topic     string
	Partition int
	// Offset is the open transaction's first record, where processing
	// waits; LogEnd is the log's end, past the records held back (unset
	// when Released).
	Offset, LogEnd int64
	// Since is when the partition was first seen waiting at Offset.
	Since time.Time
	// Released is set when the transaction has ended and the partition
	// moves on.
	Released bool
}

// HookPartitionStopped is called when a partition stops because of a
// message that cannot be processed (err wraps a *MessageError or another
// cause; see PartitionError).
type HookPartitionStopped interface {
	OnPartitionStopped(ctx context.Context, err *PartitionError)
}

// HookBatchStart is called before each transaction of a batch.
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
type BatchInfo struct {
	Topic     string
	Partition int
	// FirstOffset and LastOffset bound the batch; Size counts its messages.
	FirstOffset, LastOffset int64
	Size                    int
	// Attempt counts the transactions run for the first message of the
	// batch, from 1.
	Attempt int
	// HighWaterMark is the partition's log end offset as of the fetch that
	// brought the batch: HighWaterMark - LastOffset - 1 is the lag once the
	// batch commits.
	HighWaterMark int64
	// BatchLimit is the most messages the partition's transactions cover
	// now: Config.MaxBatch, or less while they lose races for rows (see
	// HookContention).
	BatchLimit int
	// Serialized is set when the transaction waits its turn at the
	// consumer's gate instead of racing the consumer's other transactions
	// (see HookContention).
	Serialized bool
}

// HookContention is called when a batch transaction lost a race for rows
// to another transaction: a deadlock, a serialization failure or a lock
// timeout. It runs again shortly, with fewer messages; such retries are
// not attempts of any message and never set one aside. See "Hot rows" in
// docs/design.md.
type HookContention interface {
	OnContention(ctx context.Context, b BatchInfo, c Contention)
}

// Contention describes a transaction that lost a race for rows.
type Contention struct {
	// Err is the database's error (SQLSTATE 40P01, 40001 or 55P03).
	Err error
	// BatchLimit is the partition's batch size from now on.
	BatchLimit int
	// Serialized is set when the partition's transactions now wait their
	// turn at the consumer's gate.
	Serialized bool
}

// BatchResult is the outcome of one batch transaction.
type BatchResult struct {
	// Applied and Skipped count messages whose handler ran and messages
	// skipped as duplicates, of those that committed.
	Applied, Skipped int
	// Committed counts the transaction's messages that committed: all of
	// them when Err is nil; those before the message that failed when the
	// transaction was cut there, committing what came before it; 0 when it
	// rolled back.
	Committed int
	Duration  time.Duration
	// Err is nil when the whole transaction committed, else what stopped
	// it.
	Err error
}

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
type SkipReason string

const (
	// SkipAlreadyClaimed: an earlier transaction claimed the id (a
	// redelivery, a rewind, a producer duplicate, or another member).
	SkipAlreadyClaimed SkipReason = "already_claimed"
	// SkipDuplicateInBatch: an earlier message of the same batch had the
	// same id and content.
	SkipDuplicateInBatch SkipReason = "duplicate_in_batch"
	// SkipSuspectDuplicate: the content was seen shortly before under
	// another id, and Config.SuspectDuplicates is SkipSuspects.
	SkipSuspectDuplicate SkipReason = "suspect_duplicate"
)

// HookSuspectDuplicate is called when a message's content was seen in the
// same partition within Config.SuspectDuplicateWindow under another id.
type HookSuspectDuplicate interface {
	OnSuspectDuplicate(ctx context.Context, msg *Message, first SuspectOf)
}

// SuspectOf is the earlier message a suspect duplicate looks like.
type SuspectOf struct {
	MessageID string
	Offset    int64
	At        time.Time
}

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
type Failure struct {
	Err error
	// Class is the dead-letter class the failure leads to if the message is
	// set aside.
	Class deadletter.Class
	// Attempt counts the attempts at the message so far, from 1.
	Attempt int
	// Permanent is true when the message will not be retried.
	Permanent bool
}

// HookMessageDeadLettered is called for every message set aside in the
// dead_letters table, after the transaction that did it committed.
type HookMessageDeadLettered interface {
	OnMessageDeadLettered(ctx context.Context, msg *Message, l DeadLettered)
}

// DeadLettered summarises a message set aside.
type DeadLettered struct {
	Class    deadletter.Class
	Err      error
	Attempts int
}

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
type TopicPartitionOffset struct {
	Topic     string
	Partition int
	Offset    int64
}

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

// sortHooks turns each of hs into functions the engine calls, one per hook
// interface it implements. The payloads convert between the engine's types
// and this package's at no cost: they are the same structs.
func sortHooks(hs []Hook) (engine.Hooks, error) {
	var out engine.Hooks
	for i, h := range hs {
		n := out.Len()
		if v, ok := h.(HookPartitionAssigned); ok {
			out.Assigned = append(out.Assigned, func(ctx context.Context, a engine.PartitionAssignment) {
				v.OnPartitionAssigned(ctx, PartitionAssignment(a))
			})
		}
		if v, ok := h.(HookPartitionStopped); ok {
			out.Stopped = append(out.Stopped, v.OnPartitionStopped)
		}
		if v, ok := h.(HookBatchStart); ok {
			out.Start = append(out.Start, func(ctx context.Context, b engine.BatchInfo) { v.OnBatchStart(ctx, BatchInfo(b)) })
		}
		if v, ok := h.(HookBatchEnd); ok {
			out.End = append(out.End, func(ctx context.Context, b engine.BatchInfo, r engine.BatchResult) {
				v.OnBatchEnd(ctx, BatchInfo(b), BatchResult(r))
			})
		}
		if v, ok := h.(HookMessageApplied); ok {
			out.Applied = append(out.Applied, func(ctx context.Context, m *engine.Message) { v.OnMessageApplied(ctx, (*Message)(m)) })
		}
		if v, ok := h.(HookMessageSkipped); ok {
			out.Skipped = append(out.Skipped, func(ctx context.Context, m *engine.Message, r engine.SkipReason) {
				v.OnMessageSkipped(ctx, (*Message)(m), SkipReason(r))
			})
		}
		if v, ok := h.(HookFingerprintConflict); ok {
			out.Conflict = append(out.Conflict, v.OnFingerprintConflict)
		}
		if v, ok := h.(HookOffsetsCommitted); ok {
			out.Committed = append(out.Committed, func(ctx context.Context, offs []engine.TopicPartitionOffset, err error) {
				public := make([]TopicPartitionOffset, len(offs))
				for i, o := range offs {
					public[i] = TopicPartitionOffset(o)
				}
				v.OnOffsetsCommitted(ctx, public, err)
			})
		}
		if v, ok := h.(HookMessageFailed); ok {
			out.Failed = append(out.Failed, func(ctx context.Context, m *engine.Message, f engine.Failure) {
				v.OnMessageFailed(ctx, (*Message)(m), Failure(f))
			})
		}
		if v, ok := h.(HookMessageDeadLettered); ok {
			out.Dead = append(out.Dead, func(ctx context.Context, m *engine.Message, d engine.DeadLettered) {
				v.OnMessageDeadLettered(ctx, (*Message)(m), DeadLettered(d))
			})
		}
		if v, ok := h.(HookSuspectDuplicate); ok {
			out.Suspect = append(out.Suspect, func(ctx context.Context, m *engine.Message, first engine.SuspectOf) {
				v.OnSuspectDuplicate(ctx, (*Message)(m), SuspectOf(first))
			})
		}
		if v, ok := h.(HookHandlerEnd); ok {
			out.Handler = append(out.Handler, func(ctx context.Context, m *engine.Message, d time.Duration, err error) {
				v.OnHandlerEnd(ctx, (*Message)(m), d, err)
			})
		}
		if v, ok := h.(HookContention); ok {
			out.Contention = append(out.Contention, func(ctx context.Context, b engine.BatchInfo, c engine.Contention) {
				v.OnContention(ctx, BatchInfo(b), Contention(c))
			})
		}
		if v, ok := h.(HookPartitionHeld); ok {
			out.Held = append(out.Held, func(ctx context.Context, p engine.PartitionHeld) { v.OnPartitionHeld(ctx, PartitionHeld(p)) })
		}
		if v, ok := h.(HookBatchScope); ok {
			out.BatchScope = append(out.BatchScope, func(ctx context.Context, b engine.BatchInfo, msgs []*engine.Message) (context.Context, func()) {
				public := make([]*Message, len(msgs))
				for i, m := range msgs {
					public[i] = (*Message)(m)
				}
				return v.ScopeBatch(ctx, BatchInfo(b), public)
			})
		}
		if v, ok := h.(HookHandlerScope); ok {
			out.HandlerScope = append(out.HandlerScope, func(ctx context.Context, m *engine.Message) (context.Context, func(error)) {
				return v.ScopeHandler(ctx, (*Message)(m))
			})
		}
		if out.Len() == n {
			return engine.Hooks{}, fmt.Errorf("consumer: Hooks[%d] (%T) implements no hook interface; see the Hook* interfaces in package consumer", i, h)
		}
	}
	return out, nil
}
