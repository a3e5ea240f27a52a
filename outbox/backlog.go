package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/cleanup"
)

// BacklogLimit bounds each count of a Backlog: a count stops there, so
// that counting a huge backlog every few seconds stays cheap. A count equal
// to BacklogLimit means at least that many; OldestPendingAge still tells
// how far behind the relay is.
const BacklogLimit = 100_000

// DefaultBacklogInterval is how often Run reports the backlog to
// HookBacklog, unless RelayConfig.BacklogInterval says otherwise.
const DefaultBacklogInterval = 10 * time.Second

// Backlog is what is left to deliver, read from the outbox table.
type Backlog struct {
	// Pending counts the rows to deliver, those waiting for a retry
	// included: every row neither delivered nor parked.
	Pending int64
	// Waiting counts the pending rows waiting for a retry after a failed
	// attempt (or deferred by the retry budget). Each holds back the
	// later rows of its key.
	Waiting int64
	// Parked counts the rows that will not be delivered until an
	// operator retries them (Outbox.Parked, Outbox.Retry).
	Parked int64
	// OldestPendingAge is the age of the oldest pending row (by
	// created_at, the database's clock); 0 when none is pending.
	OldestPendingAge time.Duration
}

// countBacklog counts the backlog of table, among dests (nil: all). Each
// count reads an index whose rows it counts (outbox_pending_idx,
// outbox_waiting_idx, outbox_failed_idx), up to BacklogLimit; the oldest
// row is the first of each bucket in outbox_pending_idx, one probe per
// bucket.
func countBacklog(ctx context.Context, q Querier, table string, dests []string) (Backlog, error) {
	in := `($1::text[] IS NULL OR o.destination = ANY($1))`
	count := func(cond string) string {
		return `(SELECT count(*) FROM (SELECT FROM ` + table + ` o WHERE ` + cond + ` AND ` + in + ` LIMIT $2) c)`
	}
	sql := `SELECT ` + count(`o.failed_at IS NULL`) + `, ` +
		count(`o.failed_at IS NULL AND o.next_attempt_at > '-infinity' AND o.next_attempt_at > now()`) + `, ` +
		count(`o.failed_at IS NOT NULL`) + `,
	coalesce(extract(epoch FROM now() - (SELECT min(first.created_at) FROM generate_series(0, ` + fmt.Sprint(Buckets-1) + `) b
		CROSS JOIN LATERAL (SELECT o.created_at FROM ` + table + ` o WHERE o.key_bucket = b AND o.failed_at IS NULL AND ` + in + `
		ORDER BY o.seq LIMIT 1) first)), 0)::float8`
	var b Backlog
	var age float64
	if err := q.QueryRow(ctx, sql, dests, BacklogLimit).Scan(&b.Pending, &b.Waiting, &b.Parked, &age); err != nil {
		return Backlog{}, fmt.Errorf("outbox: count the backlog: %w", err)
	}
	b.OldestPendingAge = max(time.Duration(age*float64(time.Second)), 0)
	return b, nil
}

// Backlog counts what is left to deliver in the outbox, each count up to
// BacklogLimit: what a relay of all destinations reports to HookBacklog.
func (o *Outbox) Backlog(ctx context.Context, q Querier) (Backlog, error) {
	return countBacklog(ctx, q, o.table, nil)
}

// reportBacklog calls the backlog hooks every BacklogInterval until ctx is
// done. It runs beside the rounds, so a slow count delays no delivery.
func (r *Relay) reportBacklog(ctx context.Context) {
	t := time.NewTicker(r.cfg.BacklogInterval)
	defer t.Stop()
	for {
		if b, err := r.backlog(ctx); err == nil {
			for _, h := range r.hooks.backlog {
				h.OnBacklog(ctx, b)
			}
		} else if ctx.Err() == nil {
			r.log.Warn("outbox backlog not counted; the backlog gauges keep their last values", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// backlog counts the relay's backlog in a read-only transaction of its
// own (DB only begins transactions).
func (r *Relay) backlog(ctx context.Context) (Backlog, error) {
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.BacklogInterval, backlogTimeout))
	defer cancel()
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return Backlog{}, err
	}
	defer func() { _ = cleanup.Rollback(ctx, tx) }()
	return countBacklog(ctx, tx, r.table, r.destinations())
}

// backlogTimeout is the least time one count of the backlog may take.
const backlogTimeout = 10 * time.Second
