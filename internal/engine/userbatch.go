package engine

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/txguard"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Batch is the engine's side of a consumer.Batch: the call's transaction,
// its messages and the statements the handler queued. It belongs to one
// call: once the call ends (it returned, or was abandoned after
// HandlerTimeout), Queue drops what it is given and reports it to late,
// and Tx refuses every use, so a goroutine the handler left behind cannot
// add a statement to a later transaction.
type Batch struct {
	// Tx is the consumer's transaction, as a Handler gets it.
	Tx pgx.Tx
	// Messages are the newly claimed messages, in offset order.
	Messages []*kafkaoncetype.Message

	mu     sync.Mutex
	sealed bool
	queued pgx.Batch
	index  []int // Messages[k] is the transaction's item index[k]
	// late is told about a statement queued after the call.
	late func(sql string)
	// refused is why the first statement the guard would not send was
	// dropped (one that ends the transaction): the call has failed.
	refused error
}

// Queue adds a statement to run in the transaction after HandleBatch
// returns. Queued statements are sent in one round trip together with the
// consumer's own closing statements and the COMMIT, so a batch whose effects
// are all queued costs one round trip to Postgres in all when its messages
// are new (see BatchHandler), two otherwise: one to claim, one to apply and
// commit. Use it for writes whose results the handler does not need; use Tx
// for anything it must read. A queued statement that fails fails the
// batch, as an error returned by HandleBatch does, and so does one that
// would end the transaction (COMMIT, ROLLBACK …), which is not queued.
// Queue may be called from several goroutines of the call; after the call
// it drops the statement.
func (b *Batch) Queue(sql string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sealed || callOver(b.Tx) {
		if b.late != nil {
			b.late(sql)
		}
		return
	}
	sql, args, err := txguard.Queued(b.Tx, sql, args)
	if err != nil {
		if b.refused == nil {
			b.refused = err
		}
		return
	}
	b.queued.Queue(sql, args...)
}

// refusal is why a statement of the call was not queued; call it after
// seal.
func (b *Batch) refusal() error { return b.refused }

// callOver reports whether tx is a handler's transaction whose call ended.
func callOver(tx pgx.Tx) bool {
	g, ok := tx.(*txguard.Tx)
	return ok && g.Sealed()
}

// seal ends the call: Queue drops statements from now on, and those queued
// so far may be read without a lock.
func (b *Batch) seal() {
	b.mu.Lock()
	b.sealed = true
	b.mu.Unlock()
}

// statements returns the queued statements; call it after seal.
func (b *Batch) statements() []*pgx.QueuedQuery { return b.queued.QueuedQueries }

// runQueued seals b and runs its statements in tx, one at a time (one
// message's call, in its savepoint: a failure path, where telling which
// statement failed, and keeping the connection usable when pgx cannot
// encode an argument, matter more than round trips).
func (b *Batch) runQueued(ctx context.Context, tx pgx.Tx) error {
	b.seal()
	for _, q := range b.statements() {
		if _, err := tx.Exec(ctx, q.SQL, q.Arguments...); err != nil {
			return err
		}
	}
	return nil
}
