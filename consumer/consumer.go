package consumer

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// DB is the Postgres pool the consumer runs its transactions on:
// *pgxpool.Pool implements it. Every assigned partition has a worker that
// runs its own transactions, so size the pool for at least one connection
// per partition this process may own, plus your own use.
//
// The consumer uses both methods. Begin runs its small bookkeeping
// transactions. Acquire lends a whole connection for a batch: BEGIN travels
// with the claims and COMMIT with the closing statements, so a batch costs
// two round trips (one, for a BatchHandler that only queues statements),
// and the connection of a handler abandoned after HandlerTimeout leaves the
// pool at once, closed, instead of when the handler returns.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
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
	c := withDefaults(cfg)
	if err := errors.Join(checkUnsetUnderConsumerProtocol(cfg), validate(&c)); err != nil {
		return nil, err
	}
	if p, ok := db.(interface{ Config() *pgxpool.Config }); ok {
		if err := engine.CheckQueryExecMode(p.Config().ConnConfig.DefaultQueryExecMode); err != nil {
			return nil, err
		}
	}
	hs, err := sortHooks(c.Hooks)
	if err != nil {
		return nil, err
	}
	e, err := engine.New(db, engineConfig(&c, hs))
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
// Once the schema is checked, Run records the consumer's settings in its
// row of the consumers table: the MessageID rule ("custom" for a
// MessageIDFunc), GroupID, Topics, Brokers, and whether the connections use
// TLS and which SASL mechanism (never credentials). kafkaonce audit, replay and status read them
// instead of asking for --id, --group, --topic and --brokers. The record
// only serves those tools: when it cannot be written within a few seconds,
// Run logs a warning and consumes all the same.
//
// Run may be called once per Consumer.
func (c *Consumer) Run(ctx context.Context) error { return c.engine.Run(ctx) }
