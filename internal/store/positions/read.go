package positions

import (
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Stored is a partition's stored position.
type Stored struct {
	// Next is the position; Found is false when there is none.
	Next  int64
	Found bool
	// TopicID is the id of the topic Next counts in (see QueueAdoptTopic);
	// not Valid while none is stored.
	TopicID pgtype.UUID
}

// QueueLoad adds to b the read of a partition's stored position: *next
// and *ok are set when b runs (ok false when there is none).
func (s *Store) QueueLoad(b *pgx.Batch, consumer, topic string, partition int, next *int64, ok *bool) {
	b.Queue(s.loadSQL, consumer, topic, partition).QueryRow(func(row pgx.Row) error {
		err := row.Scan(next, nil)
		*ok = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
}

// QueueLoadStored adds to b the read of a partition's stored position
// with its topic id, into *st when b runs.
func (s *Store) QueueLoadStored(b *pgx.Batch, consumer, topic string, partition int, st *Stored) {
	b.Queue(s.loadSQL, consumer, topic, partition).QueryRow(func(row pgx.Row) error {
		*st = Stored{}
		err := row.Scan(&st.Next, &st.TopicID)
		st.Found = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
}

// QueueAdoptTopic adds to b the statement that stores id as the topic id
// of a partition's position where none is stored: the id of the topic the
// member assigned the partition found. A position of the old topic, read
// by a member of the new one, would pass over the new topic's first
// messages; with the id stored, any member tells them apart before it
// reads (and the stored id, once there, changes only when an operator
// moves the position: offsets.Store.Reset clears it).
func (s *Store) QueueAdoptTopic(b *pgx.Batch, consumer, topic string, partition int, id [16]byte) {
	b.Queue(s.adoptTopicSQL, consumer, topic, partition, topicID(id))
}

// topicID is id as a parameter: NULL for the zero id (not known).
func topicID(id [16]byte) pgtype.UUID {
	return pgtype.UUID{Bytes: id, Valid: id != [16]byte{}}
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
// position when it has none, with the id of the topic it counts in, and
// then read the position into *next: start when it was stored, else the
// one another member stored first, which stands.
func (s *Store) QueueInit(b *pgx.Batch, consumer, topic string, partition int, start int64, id [16]byte, next *int64) {
	b.Queue(s.initSQL, consumer, topic, partition, start, topicID(id))
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
// id is the topic's.
func (s *Store) QueueInitTopic(b *pgx.Batch, consumer, topic string, starts []int64, id [16]byte) {
	b.Queue(s.initTopicSQL, consumer, topic, starts, topicID(id))
}
