package kafkaoncetype

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Pruning makes the consumer delete its own old claims from
// processed_messages in the background: every Interval, claims older than
// Retention are deleted in batches of Batch, skipping rows in use, so
// processing is never blocked. Replays stay safe after pruning (the stored
// positions cover them); what pruning narrows is the window in which a
// producer's late re-send of an old message is recognised.
//
// The same pass runs the Config's Pruners: the tables of other features,
// such as the HTTP front door's expired keys (idempotency.Store.Pruner),
// which a consumer prunes only when given their Pruner.
//
// Without an Interval the consumer does not prune: run the kafkaonce prune
// and kafkaonce keys prune commands instead, or set one.
type Pruning struct {
	// Interval is the time between two prunings, the first when Run
	// starts. Defaults to 0: no background pruning.
	Interval time.Duration
	// Retention is how long a claim is kept. Defaults to
	// dedupe.DefaultRetention (7 days); at least dedupe.MinRetention (1
	// day).
	Retention time.Duration
	// Batch is how many claims one transaction deletes. Defaults to
	// consumer.DefaultPruneBatch.
	Batch int
}

// A Pruner deletes the rows of one table that outlived their use, in the
// consumer's pruning pass: a feature whose table needs pruning offers one
// (idempotency.Store.Pruner for the HTTP front door's expired keys), and a
// consumer given it in Config.Pruners runs it with its own claims, at each
// Prune.Interval, Prune.Batch rows per transaction.
type Pruner struct {
	// Table is what the logs call the rows pruned.
	Table string
	// Step deletes up to limit rows in q's transaction, skipping rows that
	// running transactions hold, and returns how many it deleted. The
	// consumer calls it again until it deletes fewer than limit.
	Step func(ctx context.Context, q Querier, limit int) (int64, error)
}

// Querier runs statements: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and
// pgx.Tx all satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}
