// Package maintenance is the consumer's pruning: each table whose rows
// outlive their use gets a Pruner, offered by the feature that owns the
// table and handed in through Config.Pruners, and the consumer's
// maintenance loop runs every Pruner it was given at each Prune.Interval. The engine knows no table but its own.
package maintenance

import (
	"context"
	"log/slog"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// A Pruner deletes the rows of one table that are no longer needed: the
// consumer's claims, and those of the Config's Pruners.
type Pruner = kafkaoncetype.Pruner

// pauseBetweenSteps is the pause after a step that deleted a full batch,
// so that the database is never busy with pruning alone.
const pauseBetweenSteps = 50 * time.Millisecond

// Run runs p's steps, a transaction each (inTx), until one deletes fewer
// than limit rows or ctx is done, and returns how many rows went. A step
// that fails is logged and ends the run: the next interval tries again.
func Run(ctx context.Context, p Pruner, inTx func(ctx context.Context, fn func(q schema.Querier) error) error, limit int, log *slog.Logger) int64 {
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
