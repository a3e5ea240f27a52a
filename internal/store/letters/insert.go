package letters

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/deadletter"
)

// QueueInsert adds to b the insert of letters, all of one consumer, topic
// and partition. The letters' ID, DeadLetteredAt, PublishedAt, RedrivenAt
// and Retries are ignored.
func (s *Store) QueueInsert(b *pgx.Batch, consumer, topic string, partition int, letters []deadletter.Letter) error {
	return s.queueInsert(b, s.insertSQL, consumer, topic, partition, letters)
}

// QueueInsertProvisional adds to b the insert of provisional letters: the
// letters a share group member writes, in a transaction of its own, for
// records on their last delivery before their handlers run (see migration
// 027). The transaction that then settles a record removes its letter
// (QueueRemoveProvisional); a letter that stays is an ordinary open one.
// A message that has a letter already keeps it.
func (s *Store) QueueInsertProvisional(b *pgx.Batch, consumer, topic string, partition int, letters []deadletter.Letter) error {
	return s.queueInsert(b, s.provisionalSQL, consumer, topic, partition, letters)
}

// QueueRemoveProvisional adds to b the removal of the provisional letters
// of consumer at offsets of a partition, for the transaction that applies,
// skips or sets aside their records. A letter redriven or settled
// meanwhile is kept, as the record of what was done with it.
func (s *Store) QueueRemoveProvisional(b *pgx.Batch, consumer, topic string, partition int, offsets []int64) {
	b.Queue(`DELETE FROM `+s.table+` WHERE consumer = $1 AND topic = $2 AND partition = $3 AND kafka_offset = ANY($4)
	AND provisional AND redriven_at IS NULL AND settled_at IS NULL`, consumer, topic, partition, offsets)
}

func (s *Store) queueInsert(b *pgx.Batch, sql, consumer, topic string, partition int, letters []deadletter.Letter) error {
	n := len(letters)
	offsets := make([]int64, n)
	ids := make([]*string, n)
	keys := make([][]byte, n)
	values := make([][]byte, n)
	headers := make([]string, n)
	times := make([]*time.Time, n)
	classes := make([]string, n)
	errs := make([]string, n)
	attempts := make([]int32, n)
	firsts := make([]time.Time, n)
	lasts := make([]time.Time, n)
	retryAt := make([]*time.Time, n)
	for i := range letters {
		l := &letters[i]
		offsets[i] = l.Offset
		if l.MessageID != "" {
			ids[i] = &l.MessageID
		}
		keys[i], values[i] = l.Key, l.Value
		h := l.Headers
		if h == nil {
			h = []deadletter.Header{}
		}
		raw, err := json.Marshal(h)
		if err != nil {
			return fmt.Errorf("deadletter: encode headers: %w", err)
		}
		headers[i] = string(raw)
		if storableTime(l.MessageTime) {
			times[i] = &l.MessageTime
		}
		classes[i] = string(l.Class)
		errs[i] = truncateError(l.Error)
		attempts[i] = int32(l.Attempts)
		firsts[i], lasts[i] = l.FirstFailedAt, l.LastFailedAt
		retryAt[i] = l.RetryAt
	}
	b.Queue(sql, consumer, topic, partition, offsets, ids, keys, values, headers, times, classes, errs, attempts, firsts, lasts, retryAt)
	return nil
}

// Kafka timestamps are any int64 of milliseconds a producer sends; a
// timestamptz holds years 4713 BC to 294276 AD (and pgx's encoding less
// than that at the far end). A letter keeps a message time it can store;
// beyond these bounds (a producer's bug) it stores none rather than fail,
// which would keep the message from being set aside at all.
var (
	earliestTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	latestTime   = time.Date(294275, 1, 1, 0, 0, 0, 0, time.UTC)
)

func storableTime(t time.Time) bool {
	return !t.IsZero() && !t.Before(earliestTime) && t.Before(latestTime)
}
