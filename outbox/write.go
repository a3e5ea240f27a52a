package outbox

import (
	"context"
	"fmt"
	"hash/fnv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Buckets is how many groups keys are hashed into; relays lock whole
// buckets, so a key is only ever delivered by one relay at a time.
const Buckets = 64

// Message is a row to deliver.
type Message struct {
	// ID identifies the message to the receiver (message-id header, or
	// idempotency key). Leave it empty for a new UUIDv7 (time-ordered, so
	// inserts stay fast); set it to derive the id from what caused the
	// message, e.g. "email:" + the order event's id.
	ID string
	// Destination is the Kafka topic, or the name the delivery function
	// knows.
	Destination string
	Key         []byte
	Value       []byte
	Headers     []Header
}

// Header is a message header.
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// Execer runs a statement: pgx.Tx (the handler's transaction), *pgx.Conn and
// *pgxpool.Pool all do.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Outbox writes rows to the outbox table of one schema.
type Outbox struct {
	table string
}

// New returns an Outbox for the table in schemaName (migrated by
// consumer.Migrate).
func New(schemaName string) (*Outbox, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("outbox: schema name %w", err)
	}
	return &Outbox{table: schema.Table(schemaName, "outbox")}, nil
}

// Write adds messages to the outbox in tx and returns their ids. They are
// delivered once tx commits, and never if it rolls back. When ctx carries
// a span, each row carries its trace context (see HeaderTraceParent).
// A message the outbox cannot store (no Destination, text Postgres
// refuses, an id given twice) is refused before anything is sent, naming
// the field; Queue checks the same.
func (o *Outbox) Write(ctx context.Context, tx Execer, msgs ...Message) ([]string, error) {
	r, err := prepare(ctx, msgs)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, o.insert(), r.args()...); err != nil {
		return nil, fmt.Errorf("outbox: write: %w", err)
	}
	return r.ids, nil
}

// bucketOf hashes a key to its bucket. No key, nil or empty, is one key to
// the relay (its order is kept among such rows), so both are in bucket 0:
// two relays can never take one key's rows at once.
func bucketOf(key []byte) int32 {
	if len(key) == 0 {
		return 0
	}
	h := fnv.New32a()
	h.Write(key)
	return int32(h.Sum32() % Buckets)
}

var _ Execer = pgx.Tx(nil)
