// Package pipetx lets a transaction's BEGIN and COMMIT travel in the same
// round trip as other statements, while the code in between still gets a
// pgx.Tx.
//
// pgx's own Tx sends BEGIN and COMMIT as statements of their own, each a
// round trip to the server. The consumer instead queues BEGIN in front of
// its claim statement and COMMIT behind its closing statements, so a batch
// costs two round trips. What runs in between (the handler) gets a Tx from
// this package: every statement goes to the connection, whose transaction
// block the owner opened and will close.
package pipetx

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Tx is the transaction block open on a connection. Its Begin makes a
// savepoint; its Commit and Rollback end the block.
type Tx struct {
	ops
	savepoints int
}

// New returns the Tx of the transaction block open on conn. The caller
// opened it (a queued BEGIN) and ends it (a queued COMMIT, or Rollback).
func New(conn *pgx.Conn) *Tx { return &Tx{ops: ops{conn: conn}} }

// Begin starts a savepoint, as pgx's Tx does for a nested transaction.
func (t *Tx) Begin(ctx context.Context) (pgx.Tx, error) { return t.savepoint(ctx) }

// Commit commits the transaction block.
func (t *Tx) Commit(ctx context.Context) error {
	_, err := t.conn.Exec(ctx, "COMMIT")
	return err
}

// Rollback rolls the transaction block back.
func (t *Tx) Rollback(ctx context.Context) error {
	_, err := t.conn.Exec(ctx, "ROLLBACK")
	return err
}

func (t *Tx) savepoint(ctx context.Context) (pgx.Tx, error) {
	t.savepoints++
	name := "pipetx_sp_" + strconv.Itoa(t.savepoints)
	if _, err := t.conn.Exec(ctx, "SAVEPOINT "+name); err != nil {
		return nil, err
	}
	return &savepoint{ops: t.ops, top: t, name: name}, nil
}

// savepoint is a nested transaction: Commit releases it, Rollback rolls
// back to it.
type savepoint struct {
	ops
	top    *Tx
	name   string
	closed bool
}

func (s *savepoint) Begin(ctx context.Context) (pgx.Tx, error) {
	if s.closed {
		return nil, pgx.ErrTxClosed
	}
	return s.top.savepoint(ctx)
}

func (s *savepoint) Commit(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.conn.Exec(ctx, "RELEASE SAVEPOINT "+s.name)
	return err
}

func (s *savepoint) Rollback(ctx context.Context) error {
	if s.closed {
		return pgx.ErrTxClosed
	}
	s.closed = true
	_, err := s.conn.Exec(ctx, "ROLLBACK TO SAVEPOINT "+s.name)
	return err
}

// ops are the statements of a transaction: all go to the connection.
type ops struct {
	conn *pgx.Conn
	lo   pgx.Tx
}

func (o *ops) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return o.conn.CopyFrom(ctx, table, columns, src)
}

func (o *ops) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return o.conn.SendBatch(ctx, b)
}

// LargeObjects returns pgx's large-object API on this transaction. pgx
// builds it only from a Tx of its own, so the first call asks pgx for one
// with conn.Begin: inside the open block the server answers BEGIN with a
// warning and changes nothing, and the pgx Tx it returns is used for its
// statements only, never committed. That costs a round trip, once.
func (o *ops) LargeObjects() pgx.LargeObjects {
	if o.lo == nil {
		tx, err := o.conn.Begin(context.Background())
		if err != nil {
			// pgx.LargeObjects cannot carry an error: its methods will fail
			// on the broken connection (and a handler's panic is recovered).
			return pgx.LargeObjects{}
		}
		o.lo = tx
	}
	return o.lo.LargeObjects()
}

func (o *ops) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return o.conn.Prepare(ctx, name, sql)
}

func (o *ops) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return o.conn.Exec(ctx, sql, args...)
}

func (o *ops) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return o.conn.Query(ctx, sql, args...)
}

func (o *ops) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return o.conn.QueryRow(ctx, sql, args...)
}

func (o *ops) Conn() *pgx.Conn { return o.conn }

var (
	_ pgx.Tx = (*Tx)(nil)
	_ pgx.Tx = (*savepoint)(nil)
)

// Beginner begins transactions; *pgxpool.Pool is one.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// batchSender runs a batch of statements in one round trip;
// *pgxpool.Pool is one.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// InOneTrip runs b's statements in a transaction of their own: BEGIN, the
// statements and COMMIT pipelined in one round trip when db sends batches,
// else with db.Begin. A statement that fails leaves the block open in its
// failed state; the pool closes a connection given back like that.
func InOneTrip(ctx context.Context, db Beginner, b *pgx.Batch) error {
	if sender, ok := db.(batchSender); ok {
		full := &pgx.Batch{}
		full.Queue("BEGIN")
		full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
		full.Queue("COMMIT")
		return sender.SendBatch(ctx, full).Close()
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
}
