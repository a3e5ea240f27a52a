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
	s := c.session()
	_, err := tx.Exec(ctx, s.sql, s.args...)
	return err
}

// batchSender runs a batch of statements in one round trip;
// *pgxpool.Pool is one.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// inOneTrip runs b's statements in a transaction with the session
// settings applied: BEGIN, the settings, b and COMMIT pipelined in one
// round trip when the DB sends batches, else with Begin.
func (c *Consumer) inOneTrip(ctx context.Context, b *pgx.Batch) error {
	sender, ok := c.db.(batchSender)
	if !ok {
		return c.inTx(ctx, func(q querier) error { return q.(pgx.Tx).SendBatch(ctx, b).Close() })
	}
	full := &pgx.Batch{}
	full.Queue("BEGIN")
	c.session().queue(full)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	full.Queue("COMMIT")
	// A statement that fails leaves the block open in its failed state;
	// the pool closes a connection given back like that.
	return sender.SendBatch(ctx, full).Close()
}
