// Package maintenance is the consumer's pruning: each table whose rows
// outlive their use gets a Pruner, registered by the feature that owns the
// table, and the consumer's maintenance loop runs every Pruner it was given
// at each Prune.Interval. The engine knows no table but its own.
package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// A Pruner deletes the rows of one table that are no longer needed.
type Pruner struct {
	// Table is what the logs call the rows pruned.
	Table string
	// Step deletes up to limit rows in q's transaction, skipping rows that
	// running transactions hold, and returns how many it deleted.
	Step func(ctx context.Context, q schema.Querier, limit int) (int64, error)
}

// pauseBetweenSteps is the pause after a step that deleted a full batch,
// so that the database is never busy with pruning alone.
const pauseBetweenSteps = 50 * time.Millisecond

// Run runs p's steps, a transaction each (inTx), until one deletes fewer
// than limit rows or ctx is done, and returns how many rows went. A step
// that fails is logged and ends the run: the next interval tries again.
func (p Pruner) Run(ctx context.Context, inTx func(ctx context.Context, fn func(q schema.Querier) error) error, limit int, log *slog.Logger) int64 {
	var total int64
	for ctx.Err() == nil {
		var n int64
		err := inTx(ctx, func(q schema.Querier) (err error) {
			n, err = p.Step(ctx, q, limit)
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("pruning "+p.Table+" failed; will try at the next interval", slog.String("error", err.Error()))
			}
			break
		}
		total += n
		if n < int64(limit) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(pauseBetweenSteps):
		}
	}
	return total
}
