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
	// it has been processed (applied, skipped as a duplicate, or set aside).
	Next      int64
	UpdatedAt time.Time
}

// Store reads and sets consumer_offsets in one schema.
type Store struct {
	table string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("offsets: schema name %w", err)
	}
	return &Store{table: schema.Table(schemaName, "consumer_offsets")}, nil
}

// Load returns the position of a partition; ok is false when the consumer
// has never processed a message of it.
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
// is processing the partition.
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

// Forget deletes the stored positions of every partition of topic for a
// consumer, and returns how many it deleted. The consumer then starts those
// partitions where the group's offsets committed to Kafka say, and a
// rewound group processes messages again, guarded only by their
// processed_messages claims: like Reset, this is for an operator (or a
// test) who wants them reprocessed, and it must not run while a consumer is
// processing the topic.
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
