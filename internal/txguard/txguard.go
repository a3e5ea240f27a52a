// Package txguard wraps the transaction a handler receives. The handler
// cannot end it (kafkaonce decides whether the handler's writes commit
// together with what makes them count once: a message's claim and
// position, an HTTP request's stored key), and once the handler's call is
// over — returned, or abandoned by the watchdog — the transaction refuses
// every use: code the handler left running (a goroutine it started, a call
// that ignored its context) gets an error, never a statement in a
// transaction it does not belong to.
//
// Ending the transaction is refused at every door the guard has: Commit
// and Rollback, and every SQL text sent through it (Exec, Query,
// QueryRow, Prepare, SendBatch, and Refuses for statements queued
// elsewhere) is scanned first, and one that holds a statement controlling
// the transaction (COMMIT, ROLLBACK, BEGIN, SAVEPOINT, PREPARE
// TRANSACTION, SET TRANSACTION …) is not sent. A statement is not sent
// either once the connection is no longer in a transaction. The guard
// cannot see what is sent on the bare connection (Conn); the callers add
// a check in the database that refuses any COMMIT but their own (see
// CommitCheck).
package txguard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/notx"
)

// ErrTxControlled is returned by Commit and Rollback of a guarded
// transaction, and wrapped by the error of a statement it refused to send.
var ErrTxControlled = errors.New("the handler's transaction is committed or rolled back for the handler, not by it: return nil to commit, an error to roll back")

// ErrTxGone is returned for a statement sent after the connection left the
// transaction (a statement sent on the bare connection ended it).
var ErrTxGone = fmt.Errorf("%w; the transaction was ended by a statement sent on tx.Conn(), and nothing more is sent", ErrTxControlled)

// Refuses returns the error a guarded transaction answers sql with, when
// sql holds a statement that controls the transaction; else nil. For
// statements a handler queues to be sent later.
func Refuses(sql string) error {
	control := scan(sql).control
	if control == "" {
		return nil
	}
	advice := ""
	switch control {
	case "SAVEPOINT", "RELEASE", "ROLLBACK":
		advice = " (for a savepoint, use tx.Begin, and Commit or Rollback what it returns)"
	}
	return fmt.Errorf("%w: the text holds a %s statement, and was not sent%s", ErrTxControlled, control, advice)
}

// ErrCallOver is returned by every use of a guarded transaction after the
// handler's call ended.
var ErrCallOver = errors.New("the handler's call is over (it returned, or was abandoned after HandlerTimeout): its transaction must not be used any more; do not keep tx or use it from goroutines that outlive the call")

// Tx is a pgx.Tx whose Commit and Rollback refuse, which sends no
// statement that would end the transaction, and which refuses everything
// once sealed. Savepoints (Begin) are guarded the same way; their own
// Commit and Rollback release and roll back as usual.
type Tx struct {
	tx     pgx.Tx
	state  *state
	nested bool
}

// state is shared by a guarded transaction and its savepoints.
type state struct {
	misused atomic.Bool
	sealed  atomic.Bool
	check   *CommitCheck
}

// A CommitCheck is the caller's check in the database that refuses a
// COMMIT it did not send: a deferred constraint trigger on a row it
// writes when the transaction begins and deletes just before its own
// COMMIT. A handler's SET CONSTRAINTS … IMMEDIATE, a legitimate early look
// at its own deferred constraints, would fire that trigger too, so the
// guard sends such a statement between Lift and Restore, in one round
// trip.
type CommitCheck struct {
	// Lift queues what takes the check off (deletes its row).
	Lift func(b *pgx.Batch)
	// Restore queues what puts it back, deferred again: SET CONSTRAINTS
	// on the trigger, DEFERRED, and its row.
	Restore func(b *pgx.Batch)
}

// over answers every use of a sealed Tx.
var over = notx.Refusing(ErrCallOver)

// Wrap guards tx.
func Wrap(tx pgx.Tx) *Tx { return &Tx{tx: tx, state: &state{}} }

// WrapChecked guards tx, whose COMMIT check is check.
func WrapChecked(tx pgx.Tx, check *CommitCheck) *Tx {
	return &Tx{tx: tx, state: &state{check: check}}
}

// Seal ends the call: from now on every use of t, and of savepoints made
// from it, fails with ErrCallOver.
func (t *Tx) Seal() { t.state.sealed.Store(true) }

// Sealed reports whether the call is over.
func (t *Tx) Sealed() bool { return t.state.sealed.Load() }

// Misused reports whether the handler tried to commit or roll back, by a
// call or a statement. Its call has failed even when it went on to return
// nil.
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

// send is the transaction to send sql on: the guarded one, or one that
// refuses with the reason sql may not be sent. sends reports whether sql
// sets the mode of deferred constraints.
func (t *Tx) send(sql string) (tx pgx.Tx, constraints bool) {
	live := t.live()
	if live == over {
		return over, false
	}
	v := scan(sql)
	if v.control != "" {
		t.state.misused.Store(true)
		return notx.Refusing(Refuses(sql)), false
	}
	if c := live.Conn(); c != nil && c.PgConn().TxStatus() == 'I' {
		t.state.misused.Store(true)
		return notx.Refusing(ErrTxGone), false
	}
	return live, v.constraints && t.state.check != nil
}

// errConstraintsOnlyByExec answers SET CONSTRAINTS sent other than by
// Exec or SendBatch on a transaction with a commit check.
var errConstraintsOnlyByExec = errors.New("send SET CONSTRAINTS with tx.Exec (or in a batch): the guard lifts the transaction's commit check around it only there")

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, _ := t.send("")
	return tx.CopyFrom(ctx, table, columns, src)
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, constraints := t.send("")
	for _, q := range b.QueuedQueries {
		var c bool
		if tx, c = t.send(q.SQL); tx != t.tx {
			break
		}
		constraints = constraints || c
	}
	if !constraints || tx != t.tx {
		return tx.SendBatch(ctx, b)
	}
	return t.sendChecked(ctx, b)
}

func (t *Tx) LargeObjects() pgx.LargeObjects { return t.live().LargeObjects() }

func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, constraints := t.send(sql)
	if constraints {
		return nil, errConstraintsOnlyByExec
	}
	return tx.Prepare(ctx, name, sql)
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, constraints := t.send(sql)
	if !constraints {
		return tx.Exec(ctx, sql, args...)
	}
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			args = args[1:] // a batch has no modes; every one runs the statement
		}
	}
	var tag pgconn.CommandTag
	b := &pgx.Batch{}
	b.Queue(sql, args...).Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
	return tag, t.sendChecked(ctx, b).Close()
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, constraints := t.send(sql)
	if constraints {
		tx = notx.Refusing(errConstraintsOnlyByExec)
	}
	return tx.Query(ctx, sql, args...)
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, constraints := t.send(sql)
	if constraints {
		tx = notx.Refusing(errConstraintsOnlyByExec)
	}
	return tx.QueryRow(ctx, sql, args...)
}

// sendChecked sends b, which sets the mode of deferred constraints,
// between the commit check's Lift and Restore, in one round trip. The
// results b's caller reads are its own: Lift's are read first, Restore's
// by Close.
func (t *Tx) sendChecked(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	full := &pgx.Batch{}
	t.state.check.Lift(full)
	lifts := len(full.QueuedQueries)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	t.state.check.Restore(full)
	br := t.tx.SendBatch(ctx, full)
	for range lifts {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return notx.Refusing(fmt.Errorf("lift the transaction's commit check around SET CONSTRAINTS: %w", err)).SendBatch(ctx, b)
		}
	}
	return br
}

// Conn returns the transaction's connection, or nil once the call is over.
func (t *Tx) Conn() *pgx.Conn { return t.live().Conn() }

var _ pgx.Tx = (*Tx)(nil)
