package consumer

import (
	"context"
	"fmt"

	"github.com/kafkaonce/kafkaonce/internal/kafkafetch"
)

// MessagesDeletedError says which messages of a partition were deleted from
// the log before this consumer processed them. It matches
// ErrMessagesDeleted with errors.Is, and comes wrapped in the PartitionError
// the partition stops with (HookPartitionStopped).
//
// It is found when a partition is assigned (the stored position is below
// the log start), and by every fetch: kafka-go moves a reader below the log
// start up to it without an error, so the fetcher compares each offset
// fetched with the one it expects and looks into any gap (see
// docs/guarantee.md). A gap on a compacted topic is no loss and is passed;
// one that retention also reached before it was looked into is reported,
// as a loss cannot be ruled out.
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

func (w *worker) bounds(ctx context.Context) (first, end int64, err error) {
	return kafkafetch.Bounds(ctx, w.c.cfg.Dialer, w.c.cfg.Brokers, w.topic, w.partition)
}

// processedPosition is the stored position, -1 when there is none: the
// fetcher reads it before the log bounds to tell a loss from messages
// another member processed before they were deleted.
func (w *worker) processedPosition(ctx context.Context) (int64, error) {
	pos, has, err := w.loadPosition(ctx)
	if err != nil || !has {
		return -1, err
	}
	return pos, nil
}
