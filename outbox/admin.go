package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// PreviewBytes bounds the value Parked returns of each row.
const PreviewBytes = 4096

// Parked is a row that could not be delivered.
type Parked struct {
	ID          string `json:"id"`
	Destination string `json:"destination"`
	Key         []byte `json:"key"`
	// Value is the message's first PreviewBytes at most, so that a listing
	// of large rows stays small; Size is its whole length.
	Value     []byte    `json:"value"`
	Size      int       `json:"size"`
	Attempts  int       `json:"attempts"`
	LastError string    `json:"last_error"`
	CreatedAt time.Time `json:"created_at"`
	FailedAt  time.Time `json:"failed_at"`
}

// Parked lists rows that could not be delivered, oldest first.
func (o *Outbox) Parked(ctx context.Context, q Querier, limit int) ([]Parked, error) {
	rows, err := q.Query(ctx, `SELECT id, destination, message_key, substring(message_value FROM 1 FOR $2), coalesce(octet_length(message_value), 0),
	attempts, coalesce(last_error, ''), created_at, failed_at
FROM `+o.table+` WHERE failed_at IS NOT NULL ORDER BY seq LIMIT $1`, limit, PreviewBytes)
	if err != nil {
		return nil, fmt.Errorf("outbox: parked: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Parked])
	if err != nil {
		return nil, fmt.Errorf("outbox: parked: %w", err)
	}
	return out, nil
}

// Retry puts parked rows back to be delivered, with fresh attempts. It is
// for an operator, once the cause is fixed; the rows are then delivered
// after any later rows of their keys already delivered.
func (o *Outbox) Retry(ctx context.Context, q Querier, ids ...string) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE `+o.table+` SET failed_at = NULL, attempts = 0, next_attempt_at = '-infinity'
WHERE id = ANY($1) AND failed_at IS NOT NULL`, ids)
	if err != nil {
		return 0, fmt.Errorf("outbox: retry: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Pending counts rows waiting for delivery (not parked).
func (o *Outbox) Pending(ctx context.Context, q Querier) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM `+o.table+` WHERE failed_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: pending: %w", err)
	}
	return n, nil
}
