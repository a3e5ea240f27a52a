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
// elsewhere) is scanned first, as pgx will send it (a QueryRewriter such
// as pgx.NamedArgs applied), and one that holds a statement controlling
// the transaction (COMMIT, ROLLBACK, BEGIN, SAVEPOINT, PREPARE
// TRANSACTION, SET TRANSACTION …) is not sent. Nor is a text pgx would
// write arguments into (the simple protocol) where it reads the text
// otherwise than the server does. A statement is not sent
// either once the connection is no longer in a transaction. The guard
// cannot see what is sent on the bare connection (Conn); the callers add
// a check in the database that refuses any COMMIT but their own (see
// CommitCheck).
package txguard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/notx"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// ErrTxControlled is returned by Commit and Rollback of a guarded
// transaction, and wrapped by the error of a statement it refused to send.
var ErrTxControlled = kafkaoncetype.ErrTxControlledByConsumer

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

// Queued returns sql and args as pgx will send them in a batch on tx
// (a QueryRewriter among args applied), or the error a guarded
// transaction answers them with. For statements a handler queues to be
// sent later; a rewriter it passes gets no context of the call.
func Queued(tx pgx.Tx, sql string, args []any) (string, []any, error) {
	mode := defaultMode(tx)
	g, ok := tx.(*Tx)
	if ok {
		mode = g.state.defaultMode
	}
	c, err := resolve(context.Background(), tx.Conn, sql, args, true)
	if err != nil {
		return "", nil, err
	}
	v := scan(c.sql)
	switch {
	case v.control != "":
		return "", nil, Refuses(c.sql)
	case v.constraints && ok && g.state.check != nil:
		return "", nil, errConstraintsAlone
	case v.pgxDiverges && c.inText(mode):
		return "", nil, errPgxReadsOtherwise
	case v.openStandard && mode() == pgx.QueryExecModeSimpleProtocol:
		return "", nil, errBatchJoined // whether another query follows is not known yet
	}
	return c.sql, c.args, nil
}

// ErrCallOver is returned by every use of a guarded transaction after the
// handler's call ended.
var ErrCallOver = kafkaoncetype.ErrTxCallOver

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

	tx       pgx.Tx // the guarded transaction, for its default mode
	modeOnce sync.Once
	mode     pgx.QueryExecMode
}

// A CommitCheck is the caller's check in the database that refuses a
// COMMIT it did not send: a deferred constraint trigger on a row it
// writes when the transaction begins and deletes just before its own
// COMMIT. A handler's SET CONSTRAINTS … IMMEDIATE, a legitimate early look
// at its own deferred constraints, would fire that trigger too, so the
// guard sends such a statement between Lift and Restore, in one text (see
// setConstraints). Their statements take no arguments.
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
func Wrap(tx pgx.Tx) *Tx { return &Tx{tx: tx, state: &state{tx: tx}} }

// WrapChecked guards tx, whose COMMIT check is check.
func WrapChecked(tx pgx.Tx, check *CommitCheck) *Tx {
	return &Tx{tx: tx, state: &state{check: check, tx: tx}}
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
// refuses with the reason sql may not be sent. constraints reports whether
// sql sets the mode of deferred constraints under a commit check, with v
// what the scan found.
func (t *Tx) send(sql string) (tx pgx.Tx, v verdict, constraints bool) {
	live := t.live()
	if live == over {
		return over, v, false
	}
	v = scan(sql)
	if v.control != "" {
		t.state.misused.Store(true)
		return notx.Refusing(Refuses(sql)), v, false
	}
	if c := live.Conn(); c != nil && c.PgConn().TxStatus() == 'I' {
		t.state.misused.Store(true)
		return notx.Refusing(ErrTxGone), v, false
	}
	return live, v, v.constraints && t.state.check != nil
}

// sendCall is send for sql and args as pgx will send them (see resolve);
// c is what to hand pgx, v what the scan of its text found.
func (t *Tx) sendCall(ctx context.Context, sql string, args []any, batch bool) (tx pgx.Tx, c call, v verdict, constraints bool) {
	live := t.live()
	if live == over {
		return over, call{sql: sql, args: args}, v, false
	}
	c, err := resolve(ctx, live.Conn, sql, args, batch)
	if err != nil {
		return notx.Refusing(err), call{sql: sql, args: args}, v, false
	}
	tx, v, constraints = t.send(c.sql)
	if tx == live && v.pgxDiverges && c.inText(t.state.defaultMode) {
		return notx.Refusing(errPgxReadsOtherwise), c, v, false
	}
	return tx, c, v, constraints
}

// errPgxReadsOtherwise answers a text pgx would put arguments into where
// the server reads a string.
var errPgxReadsOtherwise = errors.New("the statement was not sent: with the simple protocol pgx writes the arguments into the text, and its reading of this text differs from PostgreSQL's (an identifier ending in e right before a quote, or a $ inside an identifier), so an argument could become statements; put a space before the quote, double-quote the identifier, or use another QueryExecMode")

// defaultMode is the connection's QueryExecMode, read once.
func (s *state) defaultMode() pgx.QueryExecMode {
	s.modeOnce.Do(func() { s.mode = defaultMode(s.tx)() })
	return s.mode
}

// defaultMode returns what reads tx's connection's QueryExecMode (pgx's
// default when there is no connection). Config copies the whole
// configuration: ask only for a text that needs it.
func defaultMode(tx pgx.Tx) func() pgx.QueryExecMode {
	return func() pgx.QueryExecMode {
		if c := tx.Conn(); c != nil {
			return c.Config().DefaultQueryExecMode
		}
		return pgx.QueryExecModeCacheStatement
	}
}

// errConstraintsAlone answers SET CONSTRAINTS sent other than on its own
// by Exec, on a transaction with a commit check.
var errConstraintsAlone = errors.New("the statement was not sent: send SET CONSTRAINTS on its own, with tx.Exec and no arguments: the guard lifts the transaction's commit check around it only there")

func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, _, _ := t.send("")
	return tx.CopyFrom(ctx, table, columns, src)
}

func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, _, _ := t.send("")
	if tx != t.tx {
		return tx.SendBatch(ctx, b)
	}
	for _, q := range b.QueuedQueries {
		// pgx rewrites the batch's queries in place as it sends them too.
		var c call
		var v verdict
		var constraints bool
		tx, c, v, constraints = t.sendCall(ctx, q.SQL, q.Arguments, true)
		switch {
		case constraints:
			tx = notx.Refusing(errConstraintsAlone)
		case tx == t.tx && len(b.QueuedQueries) > 1 && v.openStandard && t.state.defaultMode() == pgx.QueryExecModeSimpleProtocol:
			tx = notx.Refusing(errBatchJoined)
		}
		if tx != t.tx {
			return tx.SendBatch(ctx, b)
		}
		q.SQL, q.Arguments = c.sql, c.args
	}
	return t.tx.SendBatch(ctx, b)
}

// errBatchJoined answers a batch, in the simple protocol, one of whose
// queries ends inside a quote or a comment: pgx sends the queries joined
// into one text, where that query's end would swallow the next ones'
// start, and what the server ran would not be what was read.
var errBatchJoined = errors.New("the batch was not sent: a query of it ends inside a quote or a comment, and in the simple protocol pgx joins a batch's queries into one text, where it would run into the next query")

func (t *Tx) LargeObjects() pgx.LargeObjects { return t.live().LargeObjects() }

func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, _, constraints := t.send(sql)
	if constraints {
		return nil, errConstraintsAlone
	}
	return tx.Prepare(ctx, name, sql)
}

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, c, v, constraints := t.sendCall(ctx, sql, args, false)
	if !constraints || tx.Conn() == nil {
		// No connection: a stand-in for a transaction not begun yet
		// (notx), which answers for itself.
		return tx.Exec(ctx, c.sql, c.args...)
	}
	return t.setConstraints(ctx, c, v)
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, c, _, constraints := t.sendCall(ctx, sql, args, false)
	if constraints {
		tx = notx.Refusing(errConstraintsAlone)
	}
	return tx.Query(ctx, c.sql, c.args...)
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, c, _, constraints := t.sendCall(ctx, sql, args, false)
	if constraints {
		tx = notx.Refusing(errConstraintsAlone)
	}
	return tx.QueryRow(ctx, c.sql, c.args...)
}

// Conn returns the transaction's connection, or nil once the call is over.
func (t *Tx) Conn() *pgx.Conn { return t.live().Conn() }

var _ pgx.Tx = (*Tx)(nil)
