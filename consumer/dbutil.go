package consumer

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

type querier = schema.Querier

// inTx runs fn in a transaction of its own with the session settings
// applied, committing when fn returns nil.
func (c *Consumer) inTx(ctx context.Context, fn func(q querier) error) error {
	return pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if c.sessionSQL != "" {
			if _, err := tx.Exec(ctx, c.sessionSQL, c.sessionArgs...); err != nil {
				return err
			}
		}
		return fn(tx)
	})
}

// readOnly runs fn in a transaction that is rolled back.
func (c *Consumer) readOnly(ctx context.Context, fn func(q querier) error) error {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	return fn(tx)
}
