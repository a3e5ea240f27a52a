package engine

import (
	"context"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
)

// Hooks are the user's hooks (consumer.Hook), sorted by what they observe.
// The consumer package turns each into a function of the engine's types;
// the payload types below mirror the consumer package's, field for field,
// so that the conversion costs nothing.
type Hooks struct {
	Assigned   []func(context.Context, PartitionAssignment)
	Stopped    []func(context.Context, *PartitionError)
	Start      []func(context.Context, BatchInfo)
	End        []func(context.Context, BatchInfo, BatchResult)
	Applied    []func(context.Context, *Message)
	Skipped    []func(context.Context, *Message, SkipReason)
	Conflict   []func(context.Context, *FingerprintConflictError)
	Committed  []func(context.Context, []TopicPartitionOffset, error)
	Failed     []func(context.Context, *Message, Failure)
	Dead       []func(context.Context, *Message, DeadLettered)
	Suspect    []func(context.Context, *Message, SuspectOf)
	Handler    []func(context.Context, *Message, time.Duration, error)
	Contention []func(context.Context, BatchInfo, Contention)
	Held       []func(context.Context, PartitionHeld)
	// BatchScope and HandlerScope wrap a batch transaction and a handler
	// call in a context of the hook's (see scopes.go).
	BatchScope   []func(context.Context, BatchInfo, []*Message) (context.Context, func())
	HandlerScope []func(context.Context, *Message) (context.Context, func(error))
}

// Len returns the number of functions in h.
func (h *Hooks) Len() int {
	return len(h.Assigned) + len(h.Stopped) + len(h.Start) + len(h.End) + len(h.Applied) +
		len(h.Skipped) + len(h.Conflict) + len(h.Committed) + len(h.Failed) + len(h.Dead) +
		len(h.Suspect) + len(h.Handler) + len(h.Contention) + len(h.Held) + len(h.BatchScope) + len(h.HandlerScope)
}

// PartitionAssignment mirrors consumer.PartitionAssignment.
type PartitionAssignment struct {
	Topic            string
	Partition        int
	KafkaOffset      int64
	StoredPosition   int64
	LogStart, LogEnd int64
	Start            int64
}

// PartitionHeld mirrors consumer.PartitionHeld.
type PartitionHeld struct {
	Topic     string
	Partition int
	Offset    int64
	LogEnd    int64
	Since     time.Time
	Released  bool
}

// BatchInfo mirrors consumer.BatchInfo.
type BatchInfo struct {
	Topic                   string
	Partition               int
	FirstOffset, LastOffset int64
	Size                    int
	Attempt                 int
	HighWaterMark           int64
	BatchLimit              int
	Serialized              bool
}

// Contention mirrors consumer.Contention.
type Contention struct {
	Err        error
	BatchLimit int
	Serialized bool
}

// BatchResult mirrors consumer.BatchResult.
type BatchResult struct {
	Applied, Skipped int
	Committed        int
	Duration         time.Duration
	Err              error
}

// SkipReason mirrors consumer.SkipReason.
type SkipReason string

const (
	SkipAlreadyClaimed   SkipReason = "already_claimed"
	SkipDuplicateInBatch SkipReason = "duplicate_in_batch"
	SkipSuspectDuplicate SkipReason = "suspect_duplicate"
)

// SuspectOf mirrors consumer.SuspectOf.
type SuspectOf struct {
	MessageID string
	Offset    int64
	At        time.Time
}

// Failure mirrors consumer.Failure.
type Failure struct {
	Err       error
	Class     deadletter.Class
	Attempt   int
	Permanent bool
}

// DeadLettered mirrors consumer.DeadLettered.
type DeadLettered struct {
	Class    deadletter.Class
	Err      error
	Attempts int
}

// TopicPartitionOffset mirrors consumer.TopicPartitionOffset.
type TopicPartitionOffset struct {
	Topic     string
	Partition int
	Offset    int64
}
