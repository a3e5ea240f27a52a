package kafkaoncetype

import "time"

// The values below are what the consumer's hooks are called with (see the
// Hook* interfaces of package consumer).

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

// PartitionHeld describes a partition held back by a transaction a
// producer left open.
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

// PartitionPaused describes a partition of this member that a pause came
// to cover, or (Resumed) that no pause covers any more.
type PartitionPaused struct {
	Topic     string
	Partition int
	// Scope is what the covering pause names ("every topic", "topic
	// payments", "payments/3"); By, Reason and Since are as it was given.
	// All are unset when Resumed.
	Scope, By, Reason string
	Since             time.Time
	// Until is when the pause ends by itself (zero: when it is resumed).
	// A pause lengthened while it holds is reported again with its new
	// end.
	Until time.Time
	// Resumed is set when the partition fetches again, or this member
	// stops processing it while it is paused.
	Resumed bool
}

// RetriesWaiting counts a consumer's messages set aside to be retried
// later whose retries are still to come.
type RetriesWaiting struct {
	Waiting int64
	// NextDue is when the first of them is retried; zero when none waits.
	NextDue time.Time
}

// PartitionLag is how far a partition is from the end of what its
// consumer will apply.
type PartitionLag struct {
	Topic     string
	Partition int
	// Position is the partition's position: the offset after the last
	// message processed, past the transaction markers and records of
	// aborted transactions read after it.
	Position int64
	// LogEnd is the end of the log as the consumer last saw it: the high
	// watermark a fetch reported, or, read while the partition was idle,
	// the last stable offset (records of a transaction still open are not
	// there to apply yet).
	LogEnd int64
	// Lag is LogEnd - Position, at least 0: the records the consumer has
	// yet to hand to the handler or skip, and the markers and aborted
	// records among them that it has not read yet. An idle partition at
	// the end of its log has lag 0, transactional or not.
	Lag int64
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
	// brought the batch. (On a transactional topic it counts the markers
	// and aborted records after the batch: see PartitionLag for the lag.)
	// In a share group it is -1: a share member reads no log end.
	HighWaterMark int64
	// BatchLimit is the most messages the partition's transactions cover
	// now: the consumer's MaxBatch, or less while they lose races for rows
	// (see Contention).
	BatchLimit int
	// Serialized is set when the transaction waits its turn at the
	// consumer's gate instead of racing the consumer's other transactions
	// (see Contention).
	Serialized bool
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

// SkipReason says why a message was skipped.
type SkipReason string

const (
	// SkipAlreadyClaimed means an earlier transaction claimed the id (a
	// redelivery, a rewind, a producer duplicate, or another member).
	SkipAlreadyClaimed SkipReason = "already_claimed"
	// SkipDuplicateInBatch means an earlier message of the same batch had the
	// same id and content.
	SkipDuplicateInBatch SkipReason = "duplicate_in_batch"
	// SkipSuspectDuplicate means the content was seen shortly before under
	// another id, and the consumer's SuspectDuplicates is SkipSuspects.
	SkipSuspectDuplicate SkipReason = "suspect_duplicate"
)

// SuspectOf is the earlier message a suspect duplicate looks like.
type SuspectOf struct {
	MessageID string
	Offset    int64
	At        time.Time
}

// Failure describes one failed attempt at a message.
type Failure struct {
	Err error
	// Class is the dead-letter class the failure leads to if the message is
	// set aside.
	Class Class
	// Attempt counts the attempts at the message so far, from 1.
	Attempt int
	// Permanent is true when the message will not be retried.
	Permanent bool
}

// DeadLettered summarises a message set aside.
type DeadLettered struct {
	Class    Class
	Err      error
	Attempts int
}

// TopicPartitionOffset is the next offset to read in one partition.
type TopicPartitionOffset struct {
	Topic     string
	Partition int
	Offset    int64
}

// ShareEvent is something that befell a record of a share group that a
// consumer group has no counterpart for: none breaks the guarantee, but
// each costs a delivery or leaves something for an operator (see
// ShareEventKind).
type ShareEvent struct {
	Kind      ShareEventKind
	Topic     string
	Partition int
	Offset    int64
	// DeliveryCount is, for ShareDelivered, which delivery of the record
	// this is (1 for its first); 0 for the other kinds.
	DeliveryCount int
	// Err is the broker's (or the client's) answer for
	// ShareRenewalRefused and ShareSettlementLost; nil otherwise.
	Err error
}

// ShareEventKind says what befell a share group's record.
type ShareEventKind string

const (
	// ShareDelivered: a poll handed the record to this member, for its
	// DeliveryCount-th delivery. Deliveries past the first are records
	// released, or whose lock ran out, or whose accept was lost: a
	// distribution shifting up says handlers outrun the lock or members
	// die on records.
	ShareDelivered ShareEventKind = "delivered"
	// ShareRenewalRefused: the broker refused to renew the record's lock.
	// The member no longer holds it; another member may take it, and the
	// claim decides which applies it.
	ShareRenewalRefused ShareEventKind = "renewal_refused"
	// ShareLockLost: the member stopped working on a record whose lock it
	// lost (its renewal refused, or the lock ran out with no renewal
	// taken) and released it, before another attempt, retry or set-aside
	// began on it. The delivery is spent.
	ShareLockLost ShareEventKind = "lock_lost"
	// ShareSettlementLost: an accept or a reject the broker did not take
	// (refused, or never answered: it may have been taken). The record is
	// delivered again and found claimed, or set aside, without its
	// handler.
	ShareSettlementLost ShareEventKind = "settlement_lost"
	// ShareProvisionalWritten: the record is on its last delivery, and its
	// provisional dead letter committed before its handler runs.
	ShareProvisionalWritten ShareEventKind = "provisional_written"
	// ShareProvisionalRemoved: the transaction that settled a record on
	// its last delivery (applied, found claimed, or set aside with its
	// final letter) removed its provisional letter. Written minus removed
	// counts the letters left standing: records whose last delivery did
	// not finish on this member.
	ShareProvisionalRemoved ShareEventKind = "provisional_removed"
)
