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
		if err := c.applySession(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// readOnly runs fn in a transaction, with the session settings applied,
// that is rolled back.
func (c *Consumer) readOnly(ctx context.Context, fn func(q querier) error) error {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := c.applySession(ctx, tx); err != nil {
		return err
	}
	return fn(tx)
}

// applySession sets the session settings for the rest of tx.
func (c *Consumer) applySession(ctx context.Context, tx pgx.Tx) error {
	if s := c.session(); s.sql != "" {
		if _, err := tx.Exec(ctx, s.sql, s.args...); err != nil {
			return err
		}
	}
	return nil
}
