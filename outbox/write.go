package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"

	"github.com/google/uuid"
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
func (o *Outbox) Write(ctx context.Context, tx Execer, msgs ...Message) ([]string, error) {
	n := len(msgs)
	ids, dests, buckets, headers := make([]string, n), make([]string, n), make([]int32, n), make([]string, n)
	keys, values := make([][]byte, n), make([][]byte, n)
	for i, m := range msgs {
		if m.Destination == "" {
			return nil, errors.New("outbox: Message.Destination must name a topic or a delivery function")
		}
		id := m.ID
		if id == "" {
			u, err := uuid.NewV7()
			if err != nil {
				return nil, fmt.Errorf("outbox: new id: %w", err)
			}
			id = u.String()
		}
		h := withTraceContext(ctx, m.Headers)
		if h == nil {
			h = []Header{}
		}
		raw, err := json.Marshal(h)
		if err != nil {
			return nil, fmt.Errorf("outbox: encode headers: %w", err)
		}
		ids[i], dests[i], buckets[i], headers[i] = id, m.Destination, bucketOf(m.Key), string(raw)
		keys[i], values[i] = m.Key, m.Value
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+o.table+` (id, destination, message_key, key_bucket, message_value, headers)
SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::int[], $5::bytea[], $6::jsonb[])`, ids, dests, keys, buckets, values, headers)
	if err != nil {
		return nil, fmt.Errorf("outbox: write: %w", err)
	}
	return ids, nil
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
