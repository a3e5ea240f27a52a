package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
)

// redrivePollInterval is how often a running consumer looks for redrives
// requested by an operator.
const redrivePollInterval = 2 * time.Second

// runMaintenance runs the consumer's background chores until ctx is done:
// redrives requested by operators, and pruning when configured. Neither
// holds up message processing: each works in small transactions of its own.
func (c *Consumer) runMaintenance(ctx context.Context) {
	redrive := time.NewTicker(redrivePollInterval)
	defer redrive.Stop()
	var prune <-chan time.Time
	if c.cfg.PruneInterval > 0 {
		t := time.NewTicker(c.cfg.PruneInterval)
		defer t.Stop()
		prune = t.C
		c.prune(ctx) // once at start, then every interval
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-redrive.C:
			res, err := c.Redrive(ctx, deadletter.Filter{RedriveRequested: true})
			if err != nil && ctx.Err() == nil {
				c.log.Warn("requested redrives: cannot read dead letters", slog.String("error", err.Error()))
			}
			if res.Applied+res.AlreadyApplied+len(res.Failed) > 0 {
				c.log.Info("requested redrives done", slog.Int("applied", res.Applied), slog.Int("already_applied", res.AlreadyApplied), slog.Int("failed", len(res.Failed)))
			}
		case <-prune:
			c.prune(ctx)
		}
	}
}

// prune deletes this consumer's claims older than PruneRetention, and the
// idempotency keys that expired (package idempotency; they are the
// schema's, whichever process stored them).
func (c *Consumer) prune(ctx context.Context) {
	before := time.Now().Add(-c.cfg.PruneRetention)
	if n := c.pruneInBatches(ctx, "processed_messages", func(q querier) (int64, error) {
		return c.claims.Prune(ctx, q, c.cfg.Name, before, c.cfg.PruneBatch)
	}); n > 0 {
		c.log.Info("pruned processed_messages", slog.Int64("deleted", n), slog.Time("before", before))
	}
	if n := c.pruneInBatches(ctx, "idempotency_keys", func(q querier) (int64, error) {
		return c.idempotencyKeys.Prune(ctx, q, c.cfg.PruneBatch)
	}); n > 0 {
		c.log.Info("pruned expired idempotency_keys", slog.Int64("deleted", n))
	}
}

// pruneInBatches runs step, which deletes a batch of table's rows, a
// transaction each, until a batch comes back short, pausing between
// batches so the database is never busy with pruning alone. It returns
// how many rows went.
func (c *Consumer) pruneInBatches(ctx context.Context, table string, step func(q querier) (int64, error)) int64 {
	var total int64
	for ctx.Err() == nil {
		var n int64
		err := c.inTx(ctx, func(q querier) (err error) {
			n, err = step(q)
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn("pruning "+table+" failed; will try at the next interval", slog.String("error", err.Error()))
			}
			break
		}
		total += n
		if n < int64(c.cfg.PruneBatch) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return total
}
