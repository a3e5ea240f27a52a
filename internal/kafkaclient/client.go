// Package kafkaclient is the seam between the engine and a Kafka client
// library. The engine decides everything that touches the promise (where a
// partition starts, what a gap in the offsets means, when an offset may be
// committed); a Client only moves bytes: it keeps the member in its group
// and reports partitions as they come and go, fetches a partition from an
// offset, commits offsets in the member's generation, and reads a log's
// bounds.
//
// Two clients implement it: franz-go's kgo (package franz, the default) and
// segmentio's kafka-go (package kafkago). What a client cannot do that the
// promise needs, it refuses with an error instead of guessing (see the
// kafkago package).
package kafkaclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Client is a Kafka client library as the engine uses it: a member of
// the consumer group, a reader of partitions and a publisher. Its methods
// may be called from many goroutines at once. The engine's parts each take
// the piece they use (Group, Reader, Publisher), so that a test can hand
// one a scripted fake of that piece alone.
type Client interface {
	Group
	Reader
	Publisher
	// Close releases the client's connections. Fetchers must be closed
	// first.
	Close()
}

// Group is the member of the consumer group: its membership, the group's
// committed offsets, and the commits of the member's own.
type Group interface {
	// RunGroup joins the consumer group and tells m of the partitions this
	// member gains and loses, one call at a time, until ctx is done; then
	// it revokes every partition still assigned (m.Revoked), leaves the
	// group and returns. It returns early only for an error that rejoining
	// cannot mend (an invalid configuration, refused credentials).
	RunGroup(ctx context.Context, m Membership) error
	// Committed reads the group's committed offset of a partition this
	// member was assigned, with the metadata committed with it: Offset -1
	// when none is committed.
	Committed(ctx context.Context, tp TopicPartition) (CommittedOffset, error)
	// TopicCommitted reads the group's committed offsets of partitions 0
	// to partitions-1 of topic, assigned to this member or not: -1 where
	// none is committed.
	TopicCommitted(ctx context.Context, topic string, partitions int) ([]int64, error)
	// Commit commits each partition's next offset to the group, with its
	// metadata, as this member in its current generation. An error that wraps ErrFenced
	// means the broker refused it because that generation is over (the
	// partitions may be another member's by now); nothing was committed.
	// A *TopicGoneError names partitions refused because the broker does
	// not know their topic (any more).
	Commit(ctx context.Context, offsets []Offset) error
	// Member is the member as the client last heard from the group
	// coordinator: zero before it joined and after it left.
	Member() Member
}

// Member is a group member's id and the number the broker checks its
// offset commits against: the generation (classic protocol) or the
// member epoch (consumer protocol).
type Member struct {
	ID         string
	Generation int32
}

// Reader reads partitions: their records and their log bounds.
type Reader interface {
	// Open starts fetching a partition at an offset.
	Open(cfg FetchConfig) (*Fetcher, error)
	// Bounds reads a partition's log bounds.
	Bounds(ctx context.Context, topic string, partition int) (Bounds, error)
	// TopicBounds reads the bounds of every partition of a topic, indexed
	// by partition.
	TopicBounds(ctx context.Context, topic string) ([]Bounds, error)
}

// Publisher writes records to a topic.
type Publisher interface {
	// Publish writes records to topic and returns once the brokers have
	// acknowledged every one of them (acks from all in-sync replicas),
	// partitioning by key. Records of one key stay in order: once one of
	// them fails, none after it in the call is written (each fails, with
	// that record's error or ErrHeldBack wrapping it), so a caller that
	// sends the failed ones again never puts a key's record behind a later
	// one. A record larger than MaxRecordBytes is not sent. When some
	// records were written and others not, the error is a PublishErrors
	// saying which (a record refused for its size wraps ErrTooLarge);
	// after any other error, no record may be taken as written.
	// Concurrent calls may wait for one another.
	Publish(ctx context.Context, topic string, recs []Record) error
}

// Membership is told of the partitions this member of the group gains and
// loses. A Client calls one method at a time, and waits for it to return
// before it goes on with the group protocol: a call that returns early lets
// another member start on a partition this one is still processing.
type Membership interface {
	// Assigned is called with the partitions this member gains. ctx ends
	// when the group run ends.
	Assigned(ctx context.Context, parts []TopicPartition)
	// Revoked is called with partitions this member must give up. It
	// returns once their work has stopped and their last offsets are
	// committed: the member is still in the generation that owns them.
	Revoked(ctx context.Context, parts []TopicPartition)
	// Lost is called with partitions this member no longer owns, without
	// the chance to commit (its session expired): it returns once their
	// work has stopped.
	Lost(ctx context.Context, parts []TopicPartition)
}

// TopicPartition names a partition.
type TopicPartition struct {
	Topic     string
	Partition int
}

// Offset is a partition's next offset, as committed to the group.
type Offset struct {
	TopicPartition
	Next int64
	// Metadata is committed with the offset: the engine's mark of the
	// store it committed against (see internal/commitmark).
	Metadata string
}

// CommittedOffset is a partition's offset as the group has it committed.
type CommittedOffset struct {
	// Offset is the next offset, -1 when none is committed.
	Offset int64
	// Metadata is what the commit carried with it ("" for none).
	Metadata string
}

// Bounds are a partition's log bounds.
type Bounds struct {
	// Start is the first offset still in the log.
	Start int64
	// End is the high watermark: the offset the next record will get.
	End int64
	// Stable is the last stable offset: End, unless a transaction is open
	// in the partition, whose first record is then at Stable. A reader of
	// committed records gets nothing at or past it until the transaction
	// ends.
	Stable int64
	// TopicID is the topic's id, read before the offsets (zero when the
	// broker gives none).
	TopicID TopicID
}

var (
	// ErrFenced is wrapped by a Commit refused because the member's
	// generation is over.
	ErrFenced = errors.New("kafkaclient: this member's generation has ended")
	// ErrOutOfRange is wrapped by a Source's error when the broker says
	// the offset asked for is outside the log: the Fetcher then reads the
	// log's bounds to say why.
	ErrOutOfRange = errors.New("kafkaclient: the offset is outside the log")
)

// TopicGoneError is returned (or joined with other errors) by a Commit the
// broker refused for partitions of topics it does not know: deleted, or
// deleted and created again (the commit named the old topic's id).
// Committing them again cannot succeed.
type TopicGoneError struct {
	Partitions []TopicPartition
	Err        error
}

func (e *TopicGoneError) Error() string {
	return fmt.Sprintf("kafkaclient: the broker does not know the topic of %d partition(s) committed, %s/%d first: %v", len(e.Partitions), e.Partitions[0].Topic, e.Partitions[0].Partition, e.Err)
}

func (e *TopicGoneError) Unwrap() error { return e.Err }

// AddGone returns e (a new one when nil) with tp added, refused with err.
func AddGone(e *TopicGoneError, tp TopicPartition, err error) *TopicGoneError {
	if e == nil {
		e = &TopicGoneError{Err: err}
	}
	e.Partitions = append(e.Partitions, tp)
	return e
}

// Record is one record a Fetcher hands out.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []kafkaoncetype.Header
	// Time is the timestamp Kafka stored with the record.
	Time time.Time
	// HighWaterMark is the partition's log end as of the fetch that brought
	// the record (-1 when the client does not say).
	HighWaterMark int64
	// Next is the offset after the record, or after the transaction
	// markers right behind it: where the partition's position moves once
	// the record is processed. A Fetcher sets it.
	Next int64
	// Marker is set by a Source for a transaction marker, which takes an
	// offset and carries no message: a Fetcher never hands one out.
	Marker bool
}

// requestTimeout bounds a request made with a context that has no
// deadline.
const requestTimeout = 15 * time.Second

// Bounded returns ctx, or ctx with requestTimeout when it has no deadline:
// no request to a broker waits for ever.
func Bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, requestTimeout)
}
