package offsets

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Position is a row of consumer_offsets.
type Position struct {
	Consumer  string
	Topic     string
	Partition int
	// Next is the offset of the next message to process: every message below
	// it has been processed (applied, skipped as a duplicate, or set aside),
	// or lies before the partition's first start (the offset the consumer
	// first started it at, stored before any message was processed: see
	// consumer.Config.StartOffset).
	Next      int64
	UpdatedAt time.Time
}

// Store reads and sets consumer_offsets in one schema.
type Store struct {
	// schemaName is for StoreID.
	schemaName string
	table      string
	// The tables TopicRecreated changes too.
	claims, consumers, letters, attempts string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("offsets: schema name %w", err)
	}
	s := &Store{schemaName: schemaName, table: schema.Table(schemaName, "consumer_offsets")}
	s.claims, s.consumers, s.letters, s.attempts = tables(schemaName)
	return s, nil
}

// Load returns the position of a partition; ok is false when the consumer
// has never started it.
func (s *Store) Load(ctx context.Context, q Querier, consumer, topic string, partition int) (next int64, ok bool, err error) {
	err = q.QueryRow(ctx, `SELECT next_offset FROM `+s.table+` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		consumer, topic, partition).Scan(&next)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("offsets: load %s/%d: %w", topic, partition, err)
	}
	return next, true, nil
}

// List returns every stored position of a consumer, ordered by topic and
// partition.
func (s *Store) List(ctx context.Context, q Querier, consumer string) ([]Position, error) {
	rows, err := q.Query(ctx, `SELECT consumer, topic, partition, next_offset, updated_at FROM `+s.table+`
WHERE consumer = $1 ORDER BY topic, partition`, consumer)
	if err != nil {
		return nil, fmt.Errorf("offsets: list: %w", err)
	}
	ps, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Position])
	if err != nil {
		return nil, fmt.Errorf("offsets: list: %w", err)
	}
	return ps, nil
}

// Reset sets the position of a partition to next, backwards if need be.
// Messages from next on will be processed again, guarded only by their
// processed_messages claims: this is for an operator who wants them
// reprocessed, not for normal operation. It must not run while a consumer
// is processing the partition; a paused one (package pauses) is not, and
// reads its position again when it resumes, so a Reset forward while it
// is paused skips the messages between.
//
// The position moves within the topic it counts in: the topic id kept with
// it stays. A partition stopped because its topic was deleted and created
// again (kafkaoncetype.ErrTopicRecreated) stays stopped after a Reset;
// TopicRecreated is what acknowledges a re-creation.
func (s *Store) Reset(ctx context.Context, q Querier, consumer, topic string, partition int, next int64) error {
	if next < 0 {
		return fmt.Errorf("offsets: reset %s/%d to %d: offsets are not negative", topic, partition, next)
	}
	_, err := q.Exec(ctx, `INSERT INTO `+s.table+` (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()`,
		consumer, topic, partition, next)
	if err != nil {
		return fmt.Errorf("offsets: reset %s/%d: %w", topic, partition, err)
	}
	return nil
}

// ErrMoved is returned (wrapped in a *MovedError) by ResetFrom when the
// stored position is no longer the one the caller read.
var ErrMoved = errors.New("offsets: the stored position moved since it was read")

// MovedError says where a position was when ResetFrom found it moved.
type MovedError struct {
	Topic     string
	Partition int
	// Read is the position the caller read, Now the one found (-1: none).
	Read, Now int64
}

func (e *MovedError) Error() string {
	return fmt.Sprintf("offsets: the stored position of %s/%d moved from %s to %s since it was read", e.Topic, e.Partition, describe(e.Read), describe(e.Now))
}

func (e *MovedError) Unwrap() error { return ErrMoved }

func describe(next int64) string {
	if next < 0 {
		return "none"
	}
	return fmt.Sprint(next)
}

// ResetFrom sets the position of a partition to next, as Reset does, but
// only while it is still from, the position the caller read (-1: none):
// a consumer that moved it meanwhile has processed messages the caller did
// not know of, and overwriting its position would move it backwards by
// accident. It returns a *MovedError (errors.Is ErrMoved) and changes
// nothing when the position moved. The update waits for a consumer's
// transaction that holds the row, then compares with what it committed.
// In a transaction, the row stays locked until the transaction ends. Like
// Reset, it keeps the topic id stored with the position.
func (s *Store) ResetFrom(ctx context.Context, q Querier, consumer, topic string, partition int, from, next int64) error {
	if next < 0 {
		return fmt.Errorf("offsets: reset %s/%d to %d: offsets are not negative", topic, partition, next)
	}
	var sql string
	args := []any{consumer, topic, partition, next}
	if from < 0 {
		sql = `INSERT INTO ` + s.table + ` (consumer, topic, partition, next_offset) VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, topic, partition) DO NOTHING`
	} else {
		sql = `UPDATE ` + s.table + ` SET next_offset = $4, updated_at = now()
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND next_offset = $5`
		args = append(args, from)
	}
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("offsets: reset %s/%d: %w", topic, partition, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	now, ok, err := s.Load(ctx, q, consumer, topic, partition)
	if err != nil {
		return err
	}
	if !ok {
		now = -1
	}
	return &MovedError{Topic: topic, Partition: partition, Read: from, Now: now}
}

// Forget deletes the stored positions of every partition of topic for a
// consumer, and returns how many it deleted. The consumer then starts those
// partitions where the group's offsets committed to Kafka say, once an
// operator or a tool has set them (a rewind: kafkaonce replay, Kafka's
// own tools), and a rewound group processes messages again, guarded only
// by their processed_messages claims. A group offset the consumer itself
// committed against this database is taken for a lost position instead,
// and the partition is processed again from its first start, guarded by
// the claims too (see docs/guarantee.md). Like Reset, this is for an
// operator (or a test) who wants messages reprocessed, and it must not run
// while a consumer is processing the topic.
func (s *Store) Forget(ctx context.Context, q Querier, consumer, topic string) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM `+s.table+` WHERE consumer = $1 AND topic = $2`, consumer, topic)
	if err != nil {
		return 0, fmt.Errorf("offsets: forget %s: %w", topic, err)
	}
	return tag.RowsAffected(), nil
}

// Consumers lists the consumers that have stored positions.
func (s *Store) Consumers(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT consumer FROM `+s.table+` ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("offsets: consumers: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("offsets: consumers: %w", err)
	}
	return out, nil
}
