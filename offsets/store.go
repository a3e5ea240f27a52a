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

// Store reads and writes consumer_offsets in one schema.
type Store struct {
	table      string
	advanceSQL string
	lockSQL    string
	advanceFn  string
	// openFn and closeFn open and close a batch (see QueueOpen).
	openFn, closeFn string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("offsets: schema name %w", err)
	}
	t := schema.Table(schemaName, "consumer_offsets")
	return &Store{
		table: t,
		// The WHERE keeps the position from moving backwards when a slower
		// member (a zombie from an older generation, say) commits a batch
		// after a newer member already went further.
		advanceSQL: `INSERT INTO ` + t + ` AS o (consumer, topic, partition, next_offset)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()
WHERE o.next_offset < EXCLUDED.next_offset`,
		lockSQL:   `SELECT next_offset FROM ` + t + ` WHERE consumer = $1 AND topic = $2 AND partition = $3 FOR UPDATE`,
		advanceFn: schema.Table(schemaName, "advance_position"),
		openFn:    schema.Table(schemaName, "open_batch"),
		closeFn:   schema.Table(schemaName, "close_batch"),
	}, nil
}

// Table is the quoted, schema-qualified table name.
func (s *Store) Table() string { return s.table }

// QueueAdvance adds to b the statement that moves the position of a
// partition forward to next (never backward).
func (s *Store) QueueAdvance(b *pgx.Batch, consumer, topic string, partition int, next int64) {
	b.Queue(s.advanceSQL, consumer, topic, partition, next)
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

// Load returns the position of a partition; ok is false when the consumer
// has never processed a message of it.
func (s *Store) Load(ctx context.Context, q schema.Querier, consumer, topic string, partition int) (next int64, ok bool, err error) {
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

// QueueLoad adds to b the read of a partition's stored position: *next
// and *ok are set when b runs (ok false when there is none).
func (s *Store) QueueLoad(b *pgx.Batch, consumer, topic string, partition int, next *int64, ok *bool) {
	b.Queue(`SELECT next_offset FROM `+s.table+` WHERE consumer = $1 AND topic = $2 AND partition = $3`,
		consumer, topic, partition).QueryRow(func(row pgx.Row) error {
		err := row.Scan(next)
		*ok = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
}

// List returns every stored position of a consumer, ordered by topic and
// partition.
func (s *Store) List(ctx context.Context, q schema.Querier, consumer string) ([]Position, error) {
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
func (s *Store) Reset(ctx context.Context, q schema.Querier, consumer, topic string, partition int, next int64) error {
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

// Consumers lists the consumers that have stored positions.
func (s *Store) Consumers(ctx context.Context, q schema.Querier) ([]string, error) {
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
