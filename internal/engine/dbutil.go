package engine

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/pipetx"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

type querier = schema.Querier

// inTx runs fn in a transaction of its own with the session settings
// applied, committing when fn returns nil.
func (c *deps) inTx(ctx context.Context, fn func(q querier) error) error {
	return pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if err := c.applySession(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// readOnly runs fn in a transaction, with the session settings applied,
// that is rolled back.
func (c *deps) readOnly(ctx context.Context, fn func(q querier) error) error {
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
func (c *deps) applySession(ctx context.Context, tx pgx.Tx) error {
	s := c.session()
	if s.sql == "" {
		return nil
	}
	_, err := tx.Exec(ctx, s.sql, s.args...)
	return err
}

// inOneTrip runs b's statements in a transaction with the session
// settings applied, in one round trip when the DB sends batches.
func (c *deps) inOneTrip(ctx context.Context, b *pgx.Batch) error {
	full := &pgx.Batch{}
	c.session().queue(full)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	return pipetx.InOneTrip(ctx, c.db, full)
}
