package positions

import (
	"errors"

	"github.com/jackc/pgx/v5"
)

// QueueLoad adds to b the read of a partition's stored position: *next
// and *ok are set when b runs (ok false when there is none).
func (s *Store) QueueLoad(b *pgx.Batch, consumer, topic string, partition int, next *int64, ok *bool) {
	b.Queue(s.loadSQL, consumer, topic, partition).QueryRow(func(row pgx.Row) error {
		err := row.Scan(next)
		*ok = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
}

// QueueLock adds to b the statement that reads a partition's position and
// locks its row until the transaction ends; when b's results are read, next
// is set to the position (nil when there is none yet). A transaction that
// starts this way can compare the position with what it expects before it
// commits anything, knowing that nothing moves the position meanwhile.
func (s *Store) QueueLock(b *pgx.Batch, consumer, topic string, partition int, next **int64) {
	b.Queue(s.lockSQL, consumer, topic, partition).QueryRow(func(row pgx.Row) error {
		var v int64
		switch err := row.Scan(&v); {
		case errors.Is(err, pgx.ErrNoRows):
			*next = nil
		case err != nil:
			return err
		default:
			*next = &v
		}
		return nil
	})
}

// QueueInit adds to b the statements that store start as the partition's
// position when it has none, and then read the position into *next: start
// when it was stored, else the one another member stored first, which
// stands.
func (s *Store) QueueInit(b *pgx.Batch, consumer, topic string, partition int, start int64, next *int64) {
	b.Queue(s.initSQL, consumer, topic, partition, start)
	var ok bool
	s.QueueLoad(b, consumer, topic, partition, next, &ok)
}

// QueueTopicStarted adds to b the look for any stored position of topic:
// *started is set when b runs.
func (s *Store) QueueTopicStarted(b *pgx.Batch, consumer, topic string, started *bool) {
	b.Queue(s.topicStartedSQL, consumer, topic).QueryRow(func(row pgx.Row) error { return row.Scan(started) })
}

// QueueInitTopic adds to b the statement that stores starts[p] as the
// position of each partition p of topic that has none, where starts[p] is
// not negative: a consumer's first start on a topic stores one for every
// partition the topic has (but those that start where the group's offset
// says), so that a partition added later is known for one (it has none).
func (s *Store) QueueInitTopic(b *pgx.Batch, consumer, topic string, starts []int64) {
	b.Queue(s.initTopicSQL, consumer, topic, starts)
}
