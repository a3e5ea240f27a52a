package consumer

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// DB is where the consumer runs its transactions. *pgxpool.Pool implements
// it. It must be safe for concurrent use: every assigned partition has a
// worker that begins its own transactions, so size the pool for at least one
// connection per partition this process may own, plus your own use.
//
// A DB that also lends whole connections, as *pgxpool.Pool does with
// Acquire, gets batches in two round trips: BEGIN is sent with the claim
// and COMMIT with the closing statements. With Begin alone, each of them
// is a round trip of its own, and a handler abandoned after HandlerTimeout
// keeps its connection (its network connection is closed, so its
// transaction is rolled back, but the DB gets it back only when the
// handler returns); with a *pgxpool.Pool the connection leaves the pool at
// once.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Consumer is an idempotent Kafka consumer: see the package documentation.
// Create one with New, then call Run.
type Consumer struct {
	engine *engine.Consumer
}

// New validates cfg and returns a Consumer. It does not connect to Kafka or
// Postgres; Run does. The error lists every invalid field, each with the rule
// and a fix.
func New(db DB, cfg *Config) (*Consumer, error) {
	if db == nil {
		return nil, errors.New("consumer: db must not be nil: pass a *pgxpool.Pool")
	}
	if cfg == nil {
		return nil, errors.New("consumer: cfg must not be nil: pass a *consumer.Config with at least Name, Brokers, Topics and Handler")
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	hs, err := sortHooks(c.Hooks)
	if err != nil {
		return nil, err
	}
	e, err := engine.New(db, c.engineConfig(hs))
	if err != nil {
		return nil, err
	}
	return &Consumer{engine: e}, nil
}

// Migrate creates or upgrades kafkaonce's tables in schemaName
// (DefaultSchema when empty) and returns the schema version. Call it at
// start-up before Run, or run `kafkaonce migrate`. Any number of processes
// may call it at once; running it again changes nothing.
func Migrate(ctx context.Context, db DB, schemaName string) (int, error) {
	if schemaName == "" {
		schemaName = DefaultSchema
	}
	return schema.Migrate(ctx, db, schemaName)
}

// Run joins the consumer group and processes messages until ctx is
// cancelled, then drains: each worker finishes the batch it is in (within
// Config.ShutdownTimeout), the offsets of what committed are committed to
// Kafka, and the member leaves the group. Run then returns nil.
//
// Run returns an error at once when the schema is not migrated (or is newer
// than this build). Postgres or Kafka being unreachable is not an error: Run
// waits for them, logging why. A message that cannot be processed is set
// aside (Config.OnPermanentFailure) or stops its partition (see
// PartitionError); it never ends Run.
//
// Run may be called once per Consumer.
func (c *Consumer) Run(ctx context.Context) error { return c.engine.Run(ctx) }
