package outbox

import (
	"context"
	"errors"
)

// Queuer takes a statement to run later in a transaction, as a
// *consumer.Batch does (Batch.Queue): Queue hands it the outbox's INSERT.
// outbox does not import consumer, so this is the one method it needs of
// a Batch. (A *pgx.Batch does not satisfy it: its Queue returns a value.)
type Queuer interface {
	Queue(sql string, args ...any)
}

// Queue adds messages to the outbox through b, the Batch a
// consumer.BatchHandler is given, and returns their ids. It is Write for a
// handler that only queues its statements: the INSERT is queued with the
// handler's own statements, so it runs in the batch's transaction and the
// batch keeps its one round trip (see consumer.BatchHandler).
//
// The rows are written when the consumer sends the batch's statements,
// after HandleBatch returns, and commit with the claims and the effects:
// when the batch fails (the handler's error, a queued statement that
// fails, a COMMIT that does not happen) they are rolled back with it, and
// the relay never sees them. When the consumer then runs the batch's
// messages one per call, each call queues its own rows again: queue a
// message's rows in the call that handles it, as for its other effects.
// The ids are returned at once, though the rows exist only once the batch
// commits.
//
// Queue checks msgs as Write does, before anything is queued, and returns
// the same errors for the same messages: a message the outbox cannot store
// is refused here, naming the field, rather than failing the whole batch
// at COMMIT. A row whose id is already in the outbox (written by another
// transaction, not yet delivered) fails the batch, as any queued
// statement that fails does. Call Queue from within HandleBatch: once the
// call has returned, Batch.Queue drops the statement.
func (o *Outbox) Queue(ctx context.Context, b Queuer, msgs ...Message) ([]string, error) {
	if b == nil {
		return nil, errors.New("outbox: Queue needs the Batch the BatchHandler was given (got nil); outside a BatchHandler, use Write with a transaction")
	}
	r, err := prepare(ctx, msgs)
	if err != nil {
		return nil, err
	}
	if len(msgs) > 0 {
		b.Queue(o.insert(), r.args()...)
	}
	return r.ids, nil
}
