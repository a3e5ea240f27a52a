package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/usercall"
)

// handlerCutoffGrace is how long a handler whose context was cancelled
// (HandlerTimeout passed, or the consumer is shutting down) may take to
// return before its attempt is abandoned.
const handlerCutoffGrace = 2 * time.Second

// limits are the bounds of every handler call (see internal/usercall):
// the same in a worker's batch, a redrive and consumertest.
func (c *Consumer) limits() usercall.Limits {
	return usercall.Limits{Timeout: c.cfg.HandlerTimeout, Grace: handlerCutoffGrace}
}

// handle calls the handler for one message, the item at index i of the
// attempt, with tx. A BatchHandler gets a Batch of that message, and its
// queued statements run in tx before the call counts as done.
func (c *Consumer) handle(ctx context.Context, uc *usercall.Attempt, i int, tx pgx.Tx, msg *Message) error {
	if c.cfg.HandleBatch == nil {
		return uc.Call(ctx, i, tx, func(ctx context.Context, tx pgx.Tx) error {
			return c.cfg.Handle(ctx, tx, msg)
		})
	}
	return uc.Call(ctx, i, tx, func(ctx context.Context, tx pgx.Tx) error {
		b := c.newBatch([]*Message{msg}, []int{i})
		b.Tx = tx
		if err := c.cfg.HandleBatch(ctx, b); err != nil {
			b.seal()
			return err
		}
		return b.runQueued(ctx, tx)
	})
}

// handleBatch calls the BatchHandler with b, giving it tx. b is sealed
// when the call ends; its queued statements are left to the caller.
func (c *Consumer) handleBatch(ctx context.Context, uc *usercall.Attempt, tx pgx.Tx, b *Batch) error {
	err := uc.Call(ctx, b.index[0], tx, func(ctx context.Context, tx pgx.Tx) error {
		b.Tx = tx
		return c.cfg.HandleBatch(ctx, b)
	})
	b.seal()
	return err
}

// newBatch makes the Batch of one BatchHandler call. A Batch is never
// reused: a goroutine the handler left behind holds only its own.
func (c *Consumer) newBatch(msgs []*Message, index []int) *Batch {
	return &Batch{Messages: msgs, index: index, late: c.lateQueue}
}

// lateQueue reports a statement queued after its BatchHandler call ended.
func (c *Consumer) lateQueue(sql string) {
	c.log.Error("a BatchHandler queued a statement after its call had ended (returned, or abandoned after HandlerTimeout); the statement was dropped: queue only from within HandleBatch",
		slog.String("statement", truncate(sql, 200)))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
