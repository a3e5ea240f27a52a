package settings

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// A Handler applies the effect of one message inside the transaction the
// consumer opened for it: see consumer.Handler for its rules.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, msg *kafkaoncetype.Message) error
}

// A BatchHandler applies the effects of many messages at once: see
// consumer.BatchHandler for its rules.
type BatchHandler interface {
	HandleBatch(ctx context.Context, b *Batch) error
}

// A Batch is what a BatchHandler applies. It belongs to one call: once
// HandleBatch returns (or is abandoned after HandlerTimeout), Queue drops
// what it is given and the consumer logs an error, and Tx refuses every
// use, so a goroutine the handler left behind cannot add a statement to a
// later transaction.
type Batch struct {
	// Tx is the consumer's transaction, as a Handler gets it.
	Tx pgx.Tx
	// Messages are the newly claimed messages, in offset order.
	Messages []*kafkaoncetype.Message

	queue func(sql string, args ...any)
}

// NewBatch returns a Batch over tx and msgs; queue receives each statement
// the handler queues (nil drops them). consumer.NewBatch is the same.
func NewBatch(tx pgx.Tx, msgs []*kafkaoncetype.Message, queue func(sql string, args ...any)) *Batch {
	return &Batch{Tx: tx, Messages: msgs, queue: queue}
}

// Queue adds a statement to run in the transaction after HandleBatch
// returns. Queued statements are sent in one round trip together with the
// consumer's own closing statements and the COMMIT, so a batch whose effects
// are all queued costs one round trip to Postgres in all when its messages
// are new (see BatchHandler), two otherwise: one to claim, one to apply and
// commit. Use it for writes whose results the handler does not need; use Tx
// for anything it must read. A queued statement that fails fails the
// batch, as an error returned by HandleBatch does. Queue may be called from
// several goroutines of the call; after the call it drops the statement.
//
// Outbox rows travel the same way: outbox.Outbox.Queue(ctx, b, msgs...)
// checks the messages as Write does and queues their INSERT here, so they
// commit with the batch, or not at all.
func (b *Batch) Queue(sql string, args ...any) {
	if b.queue != nil {
		b.queue(sql, args...)
	}
}

// MessageIDSource derives the id under which a message is claimed: the
// dedupe key. See consumer.MessageIDSource for what makes a good one.
type MessageIDSource interface {
	MessageID(msg *kafkaoncetype.Message) (string, error)
}

// A Hook observes the consumer: any value that implements one or more of
// consumer's Hook* interfaces (see consumer.Hook).
type Hook any
