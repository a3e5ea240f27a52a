// Package attempts keeps the attempt counts of failing messages in Postgres,
// so that they survive restarts and rebalances.
//
// An attempt is recorded in a transaction of its own, committed BEFORE the
// handler runs: an attempt that kills the process is counted as surely as
// one that returns an error. Only messages retried on their own are counted
// this way; the fast path (a batch in one transaction) records nothing.
//
// To catch a message that kills the process inside a batch, where nothing is
// counted, every partition assignment is recorded too (partition_runs), and
// a run that ends cleanly (revocation, shutdown) clears its record: a run
// that finds the previous run started at the same offset and never ended
// concludes that it died in its first batch, and goes one message at a time,
// counting attempts, until it is past that batch.
package attempts

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
	"github.com/kafkaonce/kafkaonce/internal/pipetx"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Key locates a message.
type Key struct {
	Consumer  string
	Topic     string
	Partition int
	Offset    int64
}

// Record is what is known about a message's attempts.
type Record struct {
	// Attempts counts attempts started, including the one just recorded.
	Attempts       int
	FirstAttemptAt time.Time
	// LastErrorClass and LastError describe the last attempt that ended in
	// an error; empty when every attempt so far ended without one (the
	// process died).
	LastErrorClass string
	LastError      string
	// PreviousErrored reports whether the attempt before this one ended in
	// an error; false means it ended without a result (a crash).
	PreviousErrored bool
}

// Store reads and writes message_attempts and partition_runs. Each of its
// transactions is one round trip when the database sends batches.
type Store struct {
	attempts, runs string
	// Session, when set, queues the statements every transaction of the
	// store starts with: the consumer's timeouts, set for that transaction
	// only, so that no transaction of kafkaonce's can hold its locks
	// without bound.
	Session func(b *pgx.Batch)
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("attempts: schema name %w", err)
	}
	return &Store{attempts: schema.Table(schemaName, "message_attempts"), runs: schema.Table(schemaName, "partition_runs")}, nil
}

// Begin records, and commits, that an attempt of the message at k starts.
// initial is the count to store when no attempt was recorded before (2 when
// the message already failed once inside a batch, where nothing is counted).
//
// A row at k that holds another message id belongs to another message: one
// of a topic since deleted and re-created, whose stored positions were reset
// so that its offsets came round again. The count starts over at initial.
func (s *Store) Begin(ctx context.Context, db schema.Beginner, k Key, messageID string, initial int) (Record, error) {
	var r Record
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO `+s.attempts+` AS a (consumer, topic, partition, kafka_offset, message_id, attempts)
VALUES ($1, $2, $3, $4, NULLIF($5, ''), $6)
ON CONFLICT (consumer, topic, partition, kafka_offset) DO UPDATE
SET message_id = EXCLUDED.message_id, last_attempt_at = now(),
    attempts           = CASE WHEN a.message_id IS NOT DISTINCT FROM EXCLUDED.message_id THEN a.attempts + 1 ELSE EXCLUDED.attempts END,
    first_attempt_at   = CASE WHEN a.message_id IS NOT DISTINCT FROM EXCLUDED.message_id THEN a.first_attempt_at ELSE now() END,
    last_error_class   = CASE WHEN a.message_id IS NOT DISTINCT FROM EXCLUDED.message_id THEN a.last_error_class END,
    last_error         = CASE WHEN a.message_id IS NOT DISTINCT FROM EXCLUDED.message_id THEN a.last_error END,
    last_error_attempt = CASE WHEN a.message_id IS NOT DISTINCT FROM EXCLUDED.message_id THEN a.last_error_attempt END
RETURNING attempts, first_attempt_at, coalesce(last_error_class, ''), coalesce(last_error, ''), coalesce(last_error_attempt = attempts - 1, false)`,
		k.Consumer, k.Topic, k.Partition, k.Offset, messageID, initial).QueryRow(func(row pgx.Row) error {
		return row.Scan(&r.Attempts, &r.FirstAttemptAt, &r.LastErrorClass, &r.LastError, &r.PreviousErrored)
	})
	if err := s.inOneTransaction(ctx, db, b); err != nil {
		return Record{}, fmt.Errorf("attempts: record attempt of %s/%d/%d: %w", k.Topic, k.Partition, k.Offset, err)
	}
	return r, nil
}

// Fail records, and commits, how the current attempt of the message failed.
func (s *Store) Fail(ctx context.Context, db schema.Beginner, k Key, class, text string) error {
	b := &pgx.Batch{}
	b.Queue(`UPDATE `+s.attempts+` SET last_error_class = $5, last_error = $6, last_error_attempt = attempts
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND kafka_offset = $4`, k.Consumer, k.Topic, k.Partition, k.Offset, class, pgtext.Clean(text))
	if err := s.inOneTransaction(ctx, db, b); err != nil {
		return fmt.Errorf("attempts: record failure of %s/%d/%d: %w", k.Topic, k.Partition, k.Offset, err)
	}
	return nil
}

// QueueClear adds to b the removal of the attempt rows of a partition's
// messages from first to last, for the transaction that applies or
// dead-letters them.
func (s *Store) QueueClear(b *pgx.Batch, consumer, topic string, partition int, first, last int64) {
	b.Queue(`DELETE FROM `+s.attempts+` WHERE consumer = $1 AND topic = $2 AND partition = $3 AND kafka_offset BETWEEN $4 AND $5`,
		consumer, topic, partition, first, last)
}

// Pace is what a run's record shows of how the run adapts to contention
// (see kafkaonce status).
type Pace struct {
	// Run is the run's number, as Assigned returned it.
	Run int64
	// BatchLimit is the most messages the run's next transaction covers.
	BatchLimit int
	// ContentionRetries counts the run's transactions that lost a race for
	// rows and ran again.
	ContentionRetries int64
	// LastContention is when the last of them lost (zero: never).
	LastContention time.Time
	// SerializedUntil is until when the run's transactions wait their turn
	// at the consumer's gate (zero: never).
	SerializedUntil time.Time
}

// QueuePace adds to b the statement that shows p in the run's record, for
// the transaction that commits the run's next batch. A run that is not
// the partition's latest any more (a member expelled from the group) writes
// nothing.
func (s *Store) QueuePace(b *pgx.Batch, consumer, topic string, partition int, p Pace) {
	b.Queue(`UPDATE `+s.runs+` SET batch_limit = $5, contention_retries = $6, last_contention_at = $7, serialized_until = $8
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND run = $4`,
		consumer, topic, partition, p.Run, p.BatchLimit, p.ContentionRetries, nullTime(p.LastContention), nullTime(p.SerializedUntil))
}

// PartitionPace is a partition's Pace, as its latest run's record shows it.
type PartitionPace struct {
	Topic     string
	Partition int
	Pace
	// Adapted is false while the run never met contention: BatchLimit is
	// then 0, and the run's batches are Config.MaxBatch.
	Adapted bool
}

// Paces returns what the consumer's partition runs show of their pace.
func (s *Store) Paces(ctx context.Context, q schema.Querier, consumer string) ([]PartitionPace, error) {
	rows, err := q.Query(ctx, `SELECT topic, partition, run, batch_limit, contention_retries, last_contention_at, serialized_until
FROM `+s.runs+` WHERE consumer = $1 ORDER BY topic, partition`, consumer)
	if err != nil {
		return nil, fmt.Errorf("attempts: read partition runs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (PartitionPace, error) {
		var p PartitionPace
		var limit *int
		var last, until *time.Time
		err := row.Scan(&p.Topic, &p.Partition, &p.Run, &limit, &p.ContentionRetries, &last, &until)
		if limit != nil {
			p.BatchLimit, p.Adapted = *limit, true
		}
		if last != nil {
			p.LastContention = *last
		}
		if until != nil {
			p.SerializedUntil = *until
		}
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("attempts: read partition runs: %w", err)
	}
	return out, nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// Assigned records that a run of the partition starts at start and returns
// the run's number, for Ended, and what a careful start needs: how many runs
// in a row started there, whether an attempt of the message at start was in
// progress, and the highest offset with attempt rows (-1 when none). Rows
// below start are stale (those messages were processed) and are removed.
func (s *Store) Assigned(ctx context.Context, db schema.Beginner, consumer, topic string, partition int, start int64) (run int64, starts int, inProgress bool, maxOffset int64, err error) {
	b := &pgx.Batch{}
	// EXCLUDED.run is the number the sequence gave the proposed row: each
	// start gets a new one, whether it inserts the record or takes it over.
	b.Queue(`INSERT INTO `+s.runs+` AS r (consumer, topic, partition, start_offset, starts) VALUES ($1, $2, $3, $4, 1)
ON CONFLICT (consumer, topic, partition) DO UPDATE
SET starts = CASE WHEN r.start_offset = EXCLUDED.start_offset THEN r.starts + 1 ELSE 1 END,
    start_offset = EXCLUDED.start_offset, started_at = now(), run = EXCLUDED.run,
    batch_limit = NULL, contention_retries = 0, last_contention_at = NULL, serialized_until = NULL,
    stopped_at = NULL, stop_reason = NULL, held_at = NULL, held_since = NULL
RETURNING run, starts`, consumer, topic, partition, start).QueryRow(func(row pgx.Row) error { return row.Scan(&run, &starts) })
	b.Queue(`DELETE FROM `+s.attempts+` WHERE consumer = $1 AND topic = $2 AND partition = $3 AND kafka_offset < $4`,
		consumer, topic, partition, start)
	b.Queue(`SELECT coalesce(bool_or(kafka_offset = $4), false), coalesce(max(kafka_offset), -1) FROM `+s.attempts+`
WHERE consumer = $1 AND topic = $2 AND partition = $3`, consumer, topic, partition, start).QueryRow(func(row pgx.Row) error {
		return row.Scan(&inProgress, &maxOffset)
	})
	if err := s.inOneTransaction(ctx, db, b); err != nil {
		return 0, 0, false, 0, fmt.Errorf("attempts: record start of %s/%d: %w", topic, partition, err)
	}
	return run, starts, inProgress, maxOffset, nil
}

// inOneTransaction runs the session statements and b's in a transaction
// of their own, in one round trip when db sends batches (see
// pipetx.InOneTrip). Every partition records the start of its run, all of
// them at once after a rebalance, so the round trips saved shorten each
// rebalance.
func (s *Store) inOneTransaction(ctx context.Context, db schema.Beginner, b *pgx.Batch) error {
	if s.Session != nil {
		withSession := &pgx.Batch{}
		s.Session(withSession)
		withSession.QueuedQueries = append(withSession.QueuedQueries, b.QueuedQueries...)
		b = withSession
	}
	return pipetx.InOneTrip(ctx, db, b)
}

// Stopped records that the partition stopped at a message it must not skip,
// and why, for operators in other processes (kafkaonce serve). run is the
// run's number as Assigned returned it, or 0 when the partition stopped
// before its run was recorded (a check at assignment): its record is then
// created, or marked whatever run it holds; its starts are left as they
// were, so a careful start counts only runs that began. The next
// Assigned clears the mark.
func (s *Store) Stopped(ctx context.Context, db schema.Beginner, consumer, topic string, partition int, run int64, reason string) error {
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO `+s.runs+` AS r (consumer, topic, partition, start_offset, starts, stopped_at, stop_reason) VALUES ($1, $2, $3, -1, 0, now(), $5)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET stopped_at = now(), stop_reason = EXCLUDED.stop_reason
WHERE $4 = 0 OR r.run = $4`, consumer, topic, partition, run, stopReason(reason))
	if err := s.inOneTransaction(ctx, db, b); err != nil {
		return fmt.Errorf("attempts: record stop of %s/%d: %w", topic, partition, err)
	}
	return nil
}

// maxStopReason bounds a recorded stop's reason: the start says why.
const maxStopReason = 4 << 10

// stopReason makes an error text storable (see internal/pgtext) and cuts
// it to maxStopReason.
func stopReason(s string) string { return pgtext.Cut(s, maxStopReason) }

// Stop is a partition stopped at a message, as its run recorded it.
type Stop struct {
	Topic     string
	Partition int
	At        time.Time
	Reason    string
}

// Stops returns the consumer's partitions that are stopped, by topic and
// partition.
func (s *Store) Stops(ctx context.Context, q schema.Querier, consumer string) ([]Stop, error) {
	rows, err := q.Query(ctx, `SELECT topic, partition, stopped_at, coalesce(stop_reason, '') FROM `+s.runs+`
WHERE consumer = $1 AND stopped_at IS NOT NULL ORDER BY topic, partition`, consumer)
	if err != nil {
		return nil, fmt.Errorf("attempts: read stopped partitions: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Stop])
	if err != nil {
		return nil, fmt.Errorf("attempts: read stopped partitions: %w", err)
	}
	return out, nil
}

// Held records, on the run numbered run, that an open transaction holds
// the partition back at offset at since since (at -1: the wait is over).
func (s *Store) Held(ctx context.Context, db schema.Beginner, consumer, topic string, partition int, run, at int64, since time.Time) error {
	b := &pgx.Batch{}
	var heldAt *int64
	var heldSince *time.Time
	if at >= 0 {
		heldAt, heldSince = &at, &since
	}
	b.Queue(`UPDATE `+s.runs+` SET held_at = $5, held_since = $6 WHERE consumer = $1 AND topic = $2 AND partition = $3 AND run = $4`,
		consumer, topic, partition, run, heldAt, heldSince)
	if err := s.inOneTransaction(ctx, db, b); err != nil {
		return fmt.Errorf("attempts: record the wait of %s/%d on a transaction: %w", topic, partition, err)
	}
	return nil
}

// HeldPartition is a partition held back by an open transaction, as its
// run recorded it.
type HeldPartition struct {
	Topic     string
	Partition int
	At        int64
	Since     time.Time
}

// Holds returns the consumer's partitions held back by open transactions,
// by topic and partition.
func (s *Store) Holds(ctx context.Context, q schema.Querier, consumer string) ([]HeldPartition, error) {
	rows, err := q.Query(ctx, `SELECT topic, partition, held_at, held_since FROM `+s.runs+`
WHERE consumer = $1 AND held_at IS NOT NULL ORDER BY topic, partition`, consumer)
	if err != nil {
		return nil, fmt.Errorf("attempts: read held partitions: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[HeldPartition])
	if err != nil {
		return nil, fmt.Errorf("attempts: read held partitions: %w", err)
	}
	return out, nil
}

// Ended records that the run of the partition numbered run (as Assigned
// returned it) ended cleanly (revocation or shutdown, not a crash), so the
// next run there does not take it for a run that died; a wait on an open
// transaction it recorded is over with it. Only the run's own
// record is cleared: a member expelled from the group may end its run after
// the new owner's run started, at the same offset when it got nowhere, and
// clearing that record would hide a crash of the new owner from the run
// after it.
func (s *Store) Ended(ctx context.Context, db schema.Beginner, consumer, topic string, partition int, run int64) error {
	b := &pgx.Batch{}
	b.Queue(`UPDATE `+s.runs+` SET starts = 0, held_at = NULL, held_since = NULL WHERE consumer = $1 AND topic = $2 AND partition = $3 AND run = $4`,
		consumer, topic, partition, run)
	if err := s.inOneTransaction(ctx, db, b); err != nil {
		return fmt.Errorf("attempts: record end of %s/%d: %w", topic, partition, err)
	}
	return nil
}
