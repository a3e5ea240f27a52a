package consumer

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/internal/engine"
)

// A Handler applies the effect of one message inside the transaction the
// consumer opened for it.
//
// The consumer has already claimed msg.ID in processed_messages in tx. If
// Handle returns nil, the consumer records the partition's new position and
// commits tx: the claim, the handler's writes and the position become
// durable together, and only then is the Kafka offset committed. If Handle
// returns an error, or the process dies, none of it happened and the message
// will be handled again.
//
// So a handler writes its effects with tx and nothing else. It must not:
//
//   - commit or roll back tx (both return ErrTxControlledByConsumer, and the
//     message is treated as failed), by a call or a statement;
//   - send several statements in one text: each goes to Postgres as one
//     statement of the extended protocol, and Postgres refuses a text of
//     two;
//   - change what the consumer's statements after it rely on: the client
//     encoding, a search_path that names a schema before pg_catalog,
//     session_replication_role (ErrSessionChanged; the message is set
//     aside). SET LOCAL ROLE is fine: the consumer's statements run as the
//     transaction began;
//   - keep tx or msg after returning, or use them from other goroutines
//     (tx, and what it gave out, refuse with ErrTxCallOver; tx.Conn() is
//     nil);
//   - cause effects outside Postgres (e-mails, HTTP calls, Kafka writes)
//     directly: those cannot be rolled back and will be repeated when a
//     batch is retried. Write an outbox row in tx instead, or send with an
//     idempotency key derived from msg.ID.
//
// A handler may use savepoints (tx.Begin) and may return early when ctx is
// done. Messages of one partition are handled one at a time, in offset
// order; different partitions are handled concurrently, each with its own
// transaction.
type Handler = settings.Handler

// HandlerFunc adapts a function to the Handler interface.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, msg *Message) error

// Handle calls f(ctx, tx, msg).
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, msg *Message) error {
	return f(ctx, tx, msg)
}

// A BatchHandler applies the effects of many messages at once: set a
// Config's BatchHandler instead of its Handler when a statement per batch
// (INSERT … SELECT FROM unnest(…), an aggregated UPDATE) beats a statement
// per message. The rules of Handler hold for the Batch's Tx and messages.
//
// HandleBatch gets the messages of a fetched batch that this transaction
// claims, in offset order (duplicates are not in a call whose transaction
// commits), within HandlerTimeout for the whole call. When it returns nil,
// the consumer commits the claims, the effects and the new position
// together, as for a Handler.
//
// One round trip: when a handler only queues its statements (Batch.Queue)
// and never touches Batch.Tx, the consumer calls it before claiming and
// sends BEGIN, the claims, the queued statements, the new position and
// COMMIT as one pipeline. When a message id in it turns out to be claimed
// already, that attempt is dropped with its queued statements, and the
// batch runs again the ordinary way (claims first, then the handler with
// the new messages): so in a dropped attempt the handler may see
// duplicates. A handler that uses Batch.Tx in such an attempt gets an
// error, and from then on every batch claims first; Config.ClaimFirst
// does so from the start. docs/design.md, "One round trip or claim
// first", says how the pipeline is checked.
//
// When it returns an error (or a queued statement fails) for a batch of
// more than one message, the consumer cannot tell which message failed: it
// rolls the transaction back and runs the same messages again one per
// call, each in a savepoint, so that the failing message is retried or
// dead-lettered on its own and its neighbours are applied once. A
// BatchHandler must therefore give the same result for messages handled
// together or one at a time. Redrive calls it with one message.
type BatchHandler = settings.BatchHandler

// BatchHandlerFunc adapts a function to the BatchHandler interface.
type BatchHandlerFunc func(ctx context.Context, b *Batch) error

// HandleBatch calls f(ctx, b).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, b *Batch) error { return f(ctx, b) }

// A Batch is what a BatchHandler applies: its Tx and Messages, and Queue
// for statements to send with the COMMIT (see settings.Batch).
type Batch = settings.Batch

// NewBatch returns a Batch over tx and msgs for calling a BatchHandler
// outside a Consumer, as a test does; queue receives each statement the
// handler queues (nil drops them). A Consumer makes its own.
func NewBatch(tx pgx.Tx, msgs []*Message, queue func(sql string, args ...any)) *Batch {
	return settings.NewBatch(tx, msgs, queue)
}

// handleFunc is h as the engine calls it (nil when there is none).
func handleFunc(h Handler) func(context.Context, pgx.Tx, *Message) error {
	if h == nil {
		return nil
	}
	return h.Handle
}

// handleBatchFunc is h as the engine calls it (nil when there is none).
func handleBatchFunc(h BatchHandler) func(context.Context, *engine.Batch) error {
	if h == nil {
		return nil
	}
	return func(ctx context.Context, call *engine.Batch) error {
		return h.HandleBatch(ctx, NewBatch(call.Tx, call.Messages, call.Queue))
	}
}
