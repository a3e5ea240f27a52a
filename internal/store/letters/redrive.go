package letters

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// GetForUpdate returns one letter of a consumer and locks it until tx ends,
// so that two redrives of one letter run one after the other: the letter is
// read once the lock is held, as the redrive before released it.
func (s *Store) GetForUpdate(ctx context.Context, tx pgx.Tx, consumer string, id int64) (deadletter.Letter, error) {
	var locked int64
	err := tx.QueryRow(ctx, `SELECT id FROM `+s.table+` WHERE id = $1 AND consumer = $2 FOR UPDATE`, id, consumer).Scan(&locked)
	if errors.Is(err, pgx.ErrNoRows) {
		return deadletter.Letter{}, fmt.Errorf("%w: %d (of consumer %q)", deadletter.ErrNotFound, id, consumer)
	}
	if err != nil {
		return deadletter.Letter{}, fmt.Errorf("deadletter: get %d: %w", id, err)
	}
	return s.Get(ctx, tx, id)
}

// MarkRedriven records that a redrive applied the letter's message; a
// retry it was due for is done.
func (s *Store) MarkRedriven(ctx context.Context, q schema.Querier, id int64) error {
	if _, err := q.Exec(ctx, `UPDATE `+s.table+` SET redriven_at = now(), retry_at = NULL WHERE id = $1`, id); err != nil {
		return fmt.Errorf("deadletter: mark %d redriven: %w", id, err)
	}
	return nil
}

// RetryFailed records the failure of a retry of a letter of class
// retry_later whose retries were counted retries when the retry read it:
// one more retry counted, the error, and the next retry_at, or, with next
// nil (its retries ran out, or it failed for good), no next retry and
// class final: an ordinary dead letter from then on. A letter redriven or
// settled meanwhile, or whose failure another retry recorded since, is
// left as it is; recorded says whether this one was.
func (s *Store) RetryFailed(ctx context.Context, q schema.Querier, id int64, retries int, next *time.Time, final deadletter.Class, reason string) (recorded bool, err error) {
	tag, err := q.Exec(ctx, `UPDATE `+s.table+` SET retries = retries + 1, last_failed_at = now(), error = $3, retry_at = $2,
	error_class = CASE WHEN $2::timestamptz IS NULL THEN $4 ELSE error_class END
WHERE id = $1 AND retries = $5 AND redriven_at IS NULL AND settled_at IS NULL`, id, next, truncateError(reason), string(final), retries)
	if err != nil {
		return false, fmt.Errorf("deadletter: record the failed retry of %d: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// MarkRedriveFailed records why a requested redrive failed, and withdraws
// the request so it is not retried in a loop. requestedAt identifies the
// request the redrive answered (the letter's RedriveRequestedAt when the
// redrive read it): a request made since, or a letter redriven since, is
// left as it is, so a late failure of an earlier attempt never withdraws a
// newer request. It reports whether the failure was recorded.
func (s *Store) MarkRedriveFailed(ctx context.Context, q schema.Querier, id int64, requestedAt time.Time, reason string) (bool, error) {
	tag, err := q.Exec(ctx, `UPDATE `+s.table+` SET redrive_requested_at = NULL, redrive_error = $3
WHERE id = $1 AND redrive_requested_at = $2 AND redriven_at IS NULL`, id, requestedAt, truncateError(reason))
	if err != nil {
		return false, fmt.Errorf("deadletter: mark redrive of %d failed: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}
