// Package txguard wraps the transaction a handler receives. The handler
// cannot end it (the consumer decides whether the claim, the effects and
// the position commit together), and once the handler's call is over —
// returned, or abandoned by the watchdog — the transaction refuses every
// use: code the handler left running (a goroutine it started, a call that
// ignored its context) gets an error, never a statement in a transaction it
// does not belong to.
package txguard

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/notx"
)

// ErrTxControlled is returned by Commit and Rollback of a guarded
// transaction.
var ErrTxControlled = errors.New("the handler's transaction is committed or rolled back by the consumer, not by the handler: return nil to commit, an error to roll back")

// ErrCallOver is returned by every use of a guarded transaction after the
// handler's call ended.
var ErrCallOver = errors.New("the handler's call is over (it returned, or was abandoned after HandlerTimeout): its transaction must not be used any more; do not keep tx or use it from goroutines that outlive the call")

// Tx is a pgx.Tx whose Commit and Rollback refuse, and which refuses
// everything once sealed. Savepoints (Begin) are guarded the same way;
// their own Commit and Rollback release and roll back as usual.
type Tx struct {
	tx     pgx.Tx
	state  *state
	nested bool
}

// state is shared by a guarded transaction and its savepoints.
type state struct {
	misused atomic.Bool
	sealed  atomic.Bool
}

// over answers every use of a sealed Tx.
var over = notx.Refusing(ErrCallOver)

// Wrap guards tx.
func Wrap(tx pgx.Tx) *Tx { return &Tx{tx: tx, state: &state{}} }

// Seal ends the call: from now on every use of t, and of savepoints made
// from it, fails with ErrCallOver.
func (t *Tx) Seal() { t.state.sealed.Store(true) }

// Sealed reports whether the call is over.
func (t *Tx) Sealed() bool { return t.state.sealed.Load() }

// Misused reports whether the handler tried to commit or roll back. The
// consumer treats such a message as failed even when the handler went on to
// return nil.
func (t *Tx) Misused() bool { return t.state.misused.Load() }

// live is the transaction to use: the guarded one, or, after Seal, one
// that refuses.
func (t *Tx) live() pgx.Tx {
	if t.state.sealed.Load() {
		return over
	}
	return t.tx
}

// Begin starts a savepoint, guarded like t.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) {
	inner, err := t.live().Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &Tx{tx: inner, state: t.state, nested: true}, nil
}

// Commit refuses and remembers the attempt; on a savepoint it releases it.
func (t *Tx) Commit(ctx context.Context) error {
	if !t.nested {
		t.state.misused.Store(true)
		return ErrTxControlled
	}
	return t.live().Commit(ctx)
}

// Rollback refuses and remembers the attempt; on a savepoint it rolls back
// to it.
func (t *Tx) Rollback(ctx context.Context) error {
	if !t.nested {
		t.state.misused.Store(true)
		return ErrTxControlled
	}
	return t.live().Rollback(ctx)
}

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.live().CopyFrom(ctx, table, columns, src)
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.live().SendBatch(ctx, b)
}

func (t *Tx) LargeObjects() pgx.LargeObjects { return t.live().LargeObjects() }

func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.live().Prepare(ctx, name, sql)
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.live().Exec(ctx, sql, args...)
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.live().Query(ctx, sql, args...)
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.live().QueryRow(ctx, sql, args...)
}

// Conn returns the transaction's connection, or nil once the call is over.
func (t *Tx) Conn() *pgx.Conn { return t.live().Conn() }

var _ pgx.Tx = (*Tx)(nil)
