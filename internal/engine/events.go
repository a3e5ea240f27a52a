package engine

import (
	"context"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Hooks are the user's hooks (consumer.Hook), sorted by what they observe:
// the consumer package passes each hook's methods in, and the engine calls
// them with the payloads of package kafkaoncetype.
type Hooks struct {
	Assigned   []func(context.Context, kafkaoncetype.PartitionAssignment)
	Stopped    []func(context.Context, *kafkaoncetype.PartitionError)
	Start      []func(context.Context, kafkaoncetype.BatchInfo)
	End        []func(context.Context, kafkaoncetype.BatchInfo, kafkaoncetype.BatchResult)
	Applied    []func(context.Context, *kafkaoncetype.Message)
	Skipped    []func(context.Context, *kafkaoncetype.Message, kafkaoncetype.SkipReason)
	Conflict   []func(context.Context, *kafkaoncetype.FingerprintConflictError)
	Committed  []func(context.Context, []kafkaoncetype.TopicPartitionOffset, error)
	Failed     []func(context.Context, *kafkaoncetype.Message, kafkaoncetype.Failure)
	Dead       []func(context.Context, *kafkaoncetype.Message, kafkaoncetype.DeadLettered)
	Suspect    []func(context.Context, *kafkaoncetype.Message, kafkaoncetype.SuspectOf)
	Handler    []func(context.Context, *kafkaoncetype.Message, time.Duration, error)
	Contention []func(context.Context, kafkaoncetype.BatchInfo, kafkaoncetype.Contention)
	Held       []func(context.Context, kafkaoncetype.PartitionHeld)
	Paused     []func(context.Context, kafkaoncetype.PartitionPaused)
	Lag        []func(context.Context, kafkaoncetype.PartitionLag)
	Waiting    []func(context.Context, kafkaoncetype.RetriesWaiting)
	Share      []func(context.Context, kafkaoncetype.ShareEvent)
	// BatchScope and HandlerScope wrap a batch transaction and a handler
	// call in a context of the hook's (see scopes.go).
	BatchScope   []func(context.Context, kafkaoncetype.BatchInfo, []*kafkaoncetype.Message) (context.Context, func())
	HandlerScope []func(context.Context, *kafkaoncetype.Message) (context.Context, func(error))
}

// Len returns the number of functions in h.
func (h *Hooks) Len() int {
	return len(h.Assigned) + len(h.Stopped) + len(h.Start) + len(h.End) + len(h.Applied) +
		len(h.Skipped) + len(h.Conflict) + len(h.Committed) + len(h.Failed) + len(h.Dead) +
		len(h.Suspect) + len(h.Handler) + len(h.Contention) + len(h.Held) + len(h.Paused) + len(h.Lag) + len(h.Waiting) + len(h.Share) + len(h.BatchScope) + len(h.HandlerScope)
}
