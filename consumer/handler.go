package consumer

import (
	"context"

	"github.com/jackc/pgx/v5"
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
//     message is treated as failed);
//   - keep tx or msg after returning, or use them from other goroutines;
//   - cause effects outside Postgres (e-mails, HTTP calls, Kafka writes)
//     directly: those cannot be rolled back and will be repeated when a
//     batch is retried. Write an outbox row in tx instead, or send with an
//     idempotency key derived from msg.ID.
//
// A handler may use savepoints (tx.Begin) and may return early when ctx is
// done. Messages of one partition are handled one at a time, in offset
// order; different partitions are handled concurrently, each with its own
// transaction.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, msg *Message) error
}

// HandlerFunc adapts a function to the Handler interface.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, msg *Message) error

// Handle calls f(ctx, tx, msg).
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, msg *Message) error {
	return f(ctx, tx, msg)
}
