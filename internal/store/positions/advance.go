package positions

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// QueueAdvance adds to b the statement that moves the position of a
// partition forward to next (never backward).
func (s *Store) QueueAdvance(b *pgx.Batch, consumer, topic string, partition int, next int64) {
	b.Queue(s.advanceSQL, consumer, topic, partition, next)
}

// Advance moves the position of a partition forward to next; a position
// already at or past next is left alone. Call it in the transaction that
// applies the messages below next.
func (s *Store) Advance(ctx context.Context, q schema.Querier, consumer, topic string, partition int, next int64) error {
	if next < 0 {
		return fmt.Errorf("offsets: advance %s/%d to %d: offsets are not negative", topic, partition, next)
	}
	if _, err := q.Exec(ctx, s.advanceSQL, consumer, topic, partition, next); err != nil {
		return fmt.Errorf("offsets: advance %s/%d: %w", topic, partition, err)
	}
	return nil
}

// CheckFailed is the SQLSTATE AdvanceChecked's function raises.
const CheckFailed = "KO001"

// AdvanceChecked returns an SQL expression that moves the partition's
// stored position forward to next, taking parameters $first to $first+4:
// consumer, topic, partition, believed, next. Unlike QueueAdvance it fails,
// with SQLSTATE CheckFailed, when the stored position is missing or behind
// believed (what the caller committed last), and it locks the row until
// the transaction ends, as QueueLock does. A failure stops a pipelined
// transaction before its COMMIT: use it where nothing is read back before
// the COMMIT is sent. It is an expression, to share a SELECT with others.
func (s *Store) AdvanceChecked(first int) string {
	return fmt.Sprintf("%s($%d, $%d, $%d, $%d, $%d)", s.advanceFn, first, first+1, first+2, first+3, first+4)
}

// QueuePass adds to b the statement that moves a partition's position from
// from to to, only if it is at from: for offsets that hold no message
// (transaction markers). *passed is set when b runs.
func (s *Store) QueuePass(b *pgx.Batch, consumer, topic string, partition int, from, to int64, passed *bool) {
	b.Queue(s.passSQL, consumer, topic, partition, from, to).Exec(func(tag pgconn.CommandTag) error {
		*passed = tag.RowsAffected() == 1
		return nil
	})
}
