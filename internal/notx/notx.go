// Package notx provides a pgx.Tx that has no transaction behind it: every
// use fails with its error and is recorded.
//
// The consumer hands one to a BatchHandler when it tries to send the whole
// batch in one round trip, before any transaction exists. A handler that
// only queues statements never notices; one that uses the Tx gets an error,
// the attempt is dropped, and the consumer runs the batch the ordinary way
// (and from then on only that way, since the handler evidently needs Tx).
// The handler guard (internal/txguard) answers with one once a handler's
// call is over.
package notx

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// ErrNotOpen is what every use of a Tx returns.
var ErrNotOpen = errors.New("kafkaonce: the transaction is not open yet (this batch is being tried in one round trip; it will run again with an open transaction)")

// Tx is a transaction that is not open. The zero value is ready to use and
// fails with ErrNotOpen.
type Tx struct {
	used atomic.Bool
	err  error
}

// Refusing returns a Tx whose every use fails with err.
func Refusing(err error) *Tx { return &Tx{err: err} }

// Used reports whether anything was called on t.
func (t *Tx) Used() bool { return t.used.Load() }

func (t *Tx) use() error {
	t.used.Store(true)
	if t.err != nil {
		return t.err
	}
	return ErrNotOpen
}

func (t *Tx) Begin(context.Context) (pgx.Tx, error) { return nil, t.use() }
func (t *Tx) Commit(context.Context) error          { return t.use() }
func (t *Tx) Rollback(context.Context) error        { return t.use() }

func (t *Tx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, t.use()
}

func (t *Tx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return failedBatch{t.use()} }

// LargeObjects returns a value whose methods panic (pgx.LargeObjects has no
// way to carry an error); the consumer recovers the panic like any other.
func (t *Tx) LargeObjects() pgx.LargeObjects { _ = t.use(); return pgx.LargeObjects{} }

func (t *Tx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, t.use()
}

func (t *Tx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, t.use()
}

func (t *Tx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	err := t.use()
	return failed{err}, err
}

func (t *Tx) QueryRow(context.Context, string, ...any) pgx.Row { return failed{t.use()} }

// Conn returns nil: there is no connection.
func (t *Tx) Conn() *pgx.Conn { _ = t.use(); return nil }

// failed is the rows and row of a use: empty, with the error.
type failed struct{ err error }

func (f failed) Close()                                       {}
func (f failed) Err() error                                   { return f.err }
func (f failed) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (f failed) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (f failed) Next() bool                                   { return false }
func (f failed) Scan(...any) error                            { return f.err }
func (f failed) Values() ([]any, error)                       { return nil, f.err }
func (f failed) RawValues() [][]byte                          { return nil }
func (f failed) Conn() *pgx.Conn                              { return nil }

func (f failed) TypeMap() *pgtype.Map { return nil }

// failedBatch is the results of a batch sent on a Tx: each one the error.
type failedBatch struct{ err error }

func (f failedBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, f.err }
func (f failedBatch) Query() (pgx.Rows, error)         { return failed(f), f.err }
func (f failedBatch) QueryRow() pgx.Row                { return failed(f) }
func (f failedBatch) Close() error                     { return f.err }
func (f failedBatch) Tx() pgx.Tx                       { return nil }

var (
	_ pgx.Tx           = (*Tx)(nil)
	_ pgx.Rows         = failed{}
	_ pgx.Row          = failed{}
	_ pgx.BatchResults = failedBatch{}
)
