// Package txguard wraps the transaction a handler receives so that the
// handler cannot end it: the consumer decides whether the claim, the
// effects and the position commit together.
package txguard

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
)

// ErrTxControlled is returned by Commit and Rollback of a guarded
// transaction.
var ErrTxControlled = errors.New("the handler's transaction is committed or rolled back by the consumer, not by the handler: return nil to commit, an error to roll back")

// Tx is a pgx.Tx whose Commit and Rollback refuse. Savepoints (Begin) and
// every statement pass through.
type Tx struct {
	pgx.Tx
	misused bool
}

// Wrap guards tx.
func Wrap(tx pgx.Tx) *Tx { return &Tx{Tx: tx} }

// Commit refuses and remembers the attempt.
func (t *Tx) Commit(context.Context) error {
	t.misused = true
	return ErrTxControlled
}

// Rollback refuses and remembers the attempt.
func (t *Tx) Rollback(context.Context) error {
	t.misused = true
	return ErrTxControlled
}

// Misused reports whether the handler tried to commit or roll back. The
// consumer treats such a message as failed even when the handler went on to
// return nil.
func (t *Tx) Misused() bool { return t.misused }
