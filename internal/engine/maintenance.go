package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/maintenance"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// redrivePollInterval is how often a running consumer looks for redrives
// requested by an operator.
const redrivePollInterval = 2 * time.Second

// retriesWaitingEvery is how often a running consumer counts its messages
// waiting to be retried for HookRetriesWaiting: a count over the partial
// index of those letters, cheap, but no need to repeat it every poll.
const retriesWaitingEvery = 10 * time.Second

// runMaintenance runs the consumer's background chores until ctx is done:
// redrives requested by operators, and pruning when configured (see
// package maintenance). Neither
// holds up message processing: each works in small transactions of its own.
func (c *Consumer) runMaintenance(ctx context.Context) {
	redrive := time.NewTicker(redrivePollInterval)
	defer redrive.Stop()
	var prune <-chan time.Time
	if c.cfg.Prune.Interval > 0 {
		t := time.NewTicker(c.cfg.Prune.Interval)
		defer t.Stop()
		prune = t.C
		c.prune(ctx) // once at start, then every interval
	}
	var counted time.Time
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
			res, err = c.Redrive(ctx, deadletter.Filter{RetryDue: true})
			if err != nil && ctx.Err() == nil {
				c.log.Warn("retries due: cannot read dead letters", slog.String("error", err.Error()))
			}
			if res.Applied+res.AlreadyApplied+len(res.Failed) > 0 {
				c.log.Info("retries of messages set aside for later done", slog.Int("applied", res.Applied), slog.Int("already_applied", res.AlreadyApplied), slog.Int("failed", len(res.Failed)))
			}
			if len(c.hooks.Waiting) > 0 && time.Since(counted) >= retriesWaitingEvery {
				counted = time.Now()
				c.reportRetriesWaiting(ctx)
			}
		case <-prune:
			c.prune(ctx)
		}
	}
}

// reportRetriesWaiting counts the consumer's messages waiting to be
// retried for HookRetriesWaiting. A failed count reports nothing: the next
// one tries again.
func (c *Consumer) reportRetriesWaiting(ctx context.Context) {
	var w kafkaoncetype.RetriesWaiting
	err := c.readOnly(ctx, func(q querier) (err error) {
		w.Waiting, w.NextDue, err = c.letters.Waiting(ctx, q, c.cfg.Name)
		return err
	})
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn("cannot count the messages waiting to be retried", slog.String("error", err.Error()))
		}
		return
	}
	for _, h := range c.hooks.Waiting {
		h(ctx, w)
	}
}

// prune deletes this consumer's claims older than PruneRetention, then
// runs the Pruners the user handed in (Config.Pruners).
func (c *Consumer) prune(ctx context.Context) {
	before := time.Now().Add(-c.cfg.Prune.Retention)
	claims := maintenance.Pruner{Table: "processed_messages", Step: func(ctx context.Context, q querier, limit int) (int64, error) {
		return c.claims.Prune(ctx, q, c.cfg.Name, before, limit)
	}}
	if n := maintenance.Run(ctx, claims, c.inTx, c.cfg.Prune.Batch, c.log); n > 0 {
		c.log.Info("pruned processed_messages", slog.Int64("deleted", n), slog.Time("before", before))
	}
	for _, p := range c.cfg.Pruners {
		if n := maintenance.Run(ctx, p, c.inTx, c.cfg.Prune.Batch, c.log); n > 0 {
			c.log.Info("pruned "+p.Table, slog.Int64("deleted", n))
		}
	}
}
