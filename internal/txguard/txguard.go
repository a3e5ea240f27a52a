// Package txguard wraps the transaction a handler receives. The handler
// cannot end it (kafkaonce decides whether the handler's writes commit
// together with what makes them count once: a message's claim and
// position, an HTTP request's stored key), and once the handler's call is
// over — returned, or abandoned by the watchdog — the transaction and
// everything obtained from it refuse every use: code the handler left
// running (a goroutine it started, a call that ignored its context, a
// large object it kept) gets an error, never a statement in a transaction
// it does not belong to.
//
// # One statement per message
//
// Every text sent through the guard reaches the server in the extended
// query protocol, as one Parse message, whatever QueryExecMode the pool or
// the call asks for: Exec without arguments (which pgx sends in the simple
// protocol) and every call in QueryExecModeSimpleProtocol go as
// QueryExecModeExec; a batch goes as pgx's pipeline (a Parse per query),
// or, when the connection's default mode is the simple protocol (where pgx
// joins a batch into one text), one query at a time. The server parses a
// Parse message's text as one statement and refuses a text that holds two
// (42601, "cannot insert multiple commands into a prepared statement"), so
// no statement can hide behind another, however a byte is read on either
// side. What the one statement does is then decided by its leading
// keywords (see lead.go): one that controls the transaction (COMMIT,
// ROLLBACK, BEGIN, SAVEPOINT, PREPARE TRANSACTION, SET TRANSACTION …) is
// not sent. Nor is any statement once the connection, as the server last
// reported, is no longer in a transaction. pgx's doors that take a name
// are narrowed to what cannot stand in for another text: a prepared
// statement's name is one no text can be (see preparedName), and a
// QueryRewriter is handed no connection.
//
// The bare connection is not handed out: Conn returns nil, since a
// statement sent on it would pass all of the above. The database checks
// the rest at the close (see internal/schema's AfterUserCode): the
// settings kafkaonce's own statements rely on, and a COMMIT check (see
// CommitCheck) refuses any COMMIT but the caller's.
package txguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
// transaction.
var ErrTxGone = fmt.Errorf("%w; the connection is no longer in the transaction, and nothing more is sent", ErrTxControlled)

// ErrCallOver is returned by every use of a guarded transaction after the
// handler's call ended.
var ErrCallOver = kafkaoncetype.ErrTxCallOver

// refusal is the error a guarded transaction answers a statement of kind k
// with; nil when it sends the statement.
func (k statementKind) refusal() error {
	if k.control == "" {
		return nil
	}
	advice := ""
	switch k.control {
	case "SAVEPOINT", "RELEASE", "ROLLBACK":
		advice = " (for a savepoint, use tx.Begin, and Commit or Rollback what it returns)"
	}
	return fmt.Errorf("%w: the statement is a %s, and was not sent%s", ErrTxControlled, k.control, advice)
}

// Refuses returns the error a guarded transaction answers sql with, when
// its statement controls the transaction; else nil.
func Refuses(sql string) error { return kindOf(sql).refusal() }

// Queued returns sql and args as pgx will send them in a batch on tx
// (a QueryRewriter among args applied), or the error a guarded
// transaction answers them with. For statements a handler queues to be
// sent later; a rewriter it passes gets no context of the call.
func Queued(tx pgx.Tx, sql string, args []any) (string, []any, error) {
	var check *CommitCheck
	if g, ok := tx.(*Tx); ok {
		check = g.state.check
	}
	c, err := resolve(context.Background(), sql, args, true)
	if err != nil {
		return "", nil, err
	}
	k := kindOf(c.sql)
	switch {
	case k.control != "":
		return "", nil, k.refusal()
	case k.constraints && check != nil:
		return "", nil, errConstraintsAlone
	}
	return c.sql, c.args(), nil
}

// Tx is a pgx.Tx whose Commit and Rollback refuse, which sends one
// statement per protocol message and none that would end the transaction,
// and which refuses everything once sealed. Savepoints (Begin) are
// guarded the same way; their own Commit and Rollback release and roll
// back as usual.
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
// COMMIT it did not send: a deferred constraint on a row it writes when
// the transaction begins and deletes just before its own COMMIT. A
// handler's SET CONSTRAINTS … IMMEDIATE, a legitimate early look at its
// own deferred constraints, would fire that check too, so the guard sends
// such a statement between Lift and Restore, in one pipeline (see
// setConstraints).
type CommitCheck struct {
	// Lift queues what takes the check off (deletes its row).
	Lift func(b *pgx.Batch)
	// Restore queues what puts it back, deferred again: SET CONSTRAINTS
	// on the check, DEFERRED, and its row.
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

// Seal ends the call: from now on every use of t, of savepoints made from
// it and of the large objects it gave out, fails with ErrCallOver.
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

// open is the transaction to send on, or one that refuses with the
// reason nothing may be sent: the call is over, or the connection left
// the transaction.
func (t *Tx) open() pgx.Tx {
	live := t.live()
	if live == over {
		return over
	}
	if c := live.Conn(); c != nil && c.PgConn().TxStatus() == 'I' {
		t.state.misused.Store(true)
		return notx.Refusing(ErrTxGone)
	}
	return live
}

// send is the transaction to send a call of sql with args on, with the
// call as pgx will send it; or one that refuses with the reason it may not
// be sent. constraints reports a SET CONSTRAINTS under a commit check.
func (t *Tx) send(ctx context.Context, sql string, args []any, batch bool) (tx pgx.Tx, c call, constraints bool) {
	tx = t.open()
	if tx != t.tx {
		return tx, call{sql: sql, params: args}, false
	}
	c, err := resolve(ctx, sql, args, batch)
	if err != nil {
		return notx.Refusing(err), call{sql: sql, params: args}, false
	}
	k := kindOf(c.sql)
	if err := k.refusal(); err != nil {
		t.state.misused.Store(true)
		return notx.Refusing(err), c, false
	}
	return tx, c, k.constraints && t.state.check != nil
}

// defaultMode is the connection's QueryExecMode, read once. A transaction
// not open yet (notx, which counts every use, Conn included) has none:
// pgx's default stands for it.
func (s *state) defaultMode() pgx.QueryExecMode {
	s.modeOnce.Do(func() {
		s.mode = pgx.QueryExecModeCacheStatement
		if _, notOpen := s.tx.(*notx.Tx); notOpen {
			return
		}
		if c := s.tx.Conn(); c != nil {
			s.mode = c.Config().DefaultQueryExecMode // a copy of the whole configuration: once
		}
	})
	return s.mode
}

// errConstraintsAlone answers SET CONSTRAINTS sent other than on its own
// by Exec, on a transaction with a commit check.
var errConstraintsAlone = errors.New("the statement was not sent: send SET CONSTRAINTS on its own, with tx.Exec and no arguments: the guard lifts the transaction's commit check around it only there")

func (t *Tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, c, constraints := t.send(ctx, sql, args, false)
	switch {
	case tx != t.tx:
		return tx.Exec(ctx, sql, args...)
	case constraints:
		return t.setConstraints(ctx, c)
	}
	c = c.extended(t.state.defaultMode, true)
	if c.mode != pgx.QueryExecModeExec || !c.explicit {
		return tx.Exec(ctx, c.sql, c.args()...)
	}
	// pgx's Exec takes the simple protocol for a text without arguments,
	// whatever the mode: Query does not.
	rows, err := tx.Query(ctx, c.sql, c.args()...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	rows.Close()
	return rows.CommandTag(), rows.Err()
}

func (t *Tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, c, constraints := t.send(ctx, sql, args, false)
	switch {
	case tx != t.tx:
		return tx.Query(ctx, sql, args...)
	case constraints:
		return notx.Refusing(errConstraintsAlone).Query(ctx, sql)
	}
	c = c.extended(t.state.defaultMode, false)
	return tx.Query(ctx, c.sql, c.args()...)
}

func (t *Tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, c, constraints := t.send(ctx, sql, args, false)
	switch {
	case tx != t.tx:
		return tx.QueryRow(ctx, sql, args...)
	case constraints:
		return notx.Refusing(errConstraintsAlone).QueryRow(ctx, sql)
	}
	c = c.extended(t.state.defaultMode, false)
	return tx.QueryRow(ctx, c.sql, c.args()...)
}

// Prepare prepares sql under name: a Parse message, one statement. A
// statement prepared to run later is judged now, as if it ran now; its
// name must be one no statement's text can be (see preparedName).
func (t *Tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := preparedName(name); err != nil {
		return nil, err
	}
	tx, _, constraints := t.send(ctx, sql, nil, false)
	if constraints {
		return nil, errConstraintsAlone
	}
	return tx.Prepare(ctx, name, sql)
}

// preparedName refuses a name for a prepared statement that a text could
// be. pgx runs the statement prepared under a name in place of any text
// equal to it, sent by anyone on the connection, for the rest of the
// session: kafkaonce's own COMMIT would run a handler's "SELECT 1"
// prepared as "COMMIT". A name of letters, digits and underscores holds
// no space, so it equals no text of more than one word, and one that is
// not a statement's keyword equals no text of one word (ABORT, BEGIN,
// COMMIT, END, ROLLBACK …, whatever their case). The unnamed statement
// ("") is not kept.
func preparedName(name string) error {
	if name == "" {
		return nil
	}
	ok := wordStart(name[0]) && name[0] < 0x80
	for i := 1; ok && i < len(name); i++ {
		ok = name[i] < 0x80 && wordPart(name[i]) && name[i] != '$'
	}
	if ok && !oneWordStatements[strings.ToUpper(name)] {
		return nil
	}
	return fmt.Errorf("%w: the statement was not prepared: name it with letters, digits and underscores, and not a statement's keyword such as COMMIT (got %q): pgx runs a prepared statement in place of any text equal to its name, the consumer's own statements included", ErrTxControlled, name)
}

// oneWordStatements are the statements PostgreSQL reads from one keyword.
var oneWordStatements = map[string]bool{
	"ABORT": true, "ANALYSE": true, "ANALYZE": true, "BEGIN": true, "CHECKPOINT": true,
	"CLUSTER": true, "COMMIT": true, "END": true, "ROLLBACK": true, "VACUUM": true,
}

// CopyFrom sends pgx's COPY, whose text pgx writes from the names given,
// each double-quoted: it runs only while the session's client_encoding, as
// the server last reported it, is UTF8, where no byte of a name can end
// its quotes.
func (t *Tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx := t.open()
	if tx == t.tx {
		if enc := tx.Conn().PgConn().ParameterStatus("client_encoding"); enc != "UTF8" {
			return 0, fmt.Errorf("the COPY was not sent: the session's client_encoding is %q, and kafkaonce sends a COPY only in UTF8", enc)
		}
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

// Conn returns nil: a statement sent on the bare connection would pass the
// guard by. Everything a handler needs is on the transaction itself.
func (t *Tx) Conn() *pgx.Conn { return nil }

var _ pgx.Tx = (*Tx)(nil)
