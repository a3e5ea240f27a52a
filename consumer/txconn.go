package consumer

import (
	"context"
	"errors"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/pipetx"
)

// connLender is a DB that lends whole connections, as *pgxpool.Pool does.
// With one, a batch transaction costs two round trips: BEGIN travels with
// the claim, COMMIT with the closing statements. Without one (a DB that
// only has Begin), BEGIN and COMMIT are round trips of their own.
type connLender interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// batchTx is one batch transaction.
type batchTx struct {
	tx   pgx.Tx        // what statements (and the handler) run on
	pool *pgxpool.Conn // the lent connection; nil on the Begin path
	done bool
}

// beginWith begins a transaction and runs b in it, in one round trip when
// the DB lends connections.
func (c *Consumer) beginWith(ctx context.Context, b *pgx.Batch) (*batchTx, error) {
	lender, ok := c.db.(connLender)
	if !ok {
		tx, err := c.db.Begin(ctx)
		if err != nil {
			return nil, err
		}
		t := &batchTx{tx: tx}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			t.rollback(ctx)
			return nil, err
		}
		return t, nil
	}
	conn, err := lender.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	t := &batchTx{tx: pipetx.New(conn.Conn()), pool: conn}
	var full pgx.Batch
	full.Queue("BEGIN")
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	if err := conn.SendBatch(ctx, &full).Close(); err != nil {
		t.rollback(ctx)
		return nil, err
	}
	return t, nil
}

// commitWith runs b and commits, in one round trip when the DB lends
// connections. An error that is not a *pgconn.PgError leaves the outcome
// unknown: the COMMIT may have been applied.
func (t *batchTx) commitWith(ctx context.Context, b *pgx.Batch) error {
	if t.pool == nil {
		if err := t.tx.SendBatch(ctx, b).Close(); err != nil {
			return &beforeCommitError{err}
		}
		err := t.tx.Commit(ctx)
		t.done = true
		return err
	}
	b.Queue("COMMIT")
	err := t.pool.SendBatch(ctx, b).Close()
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			// The server answered with an error, so it skipped the rest of
			// the pipeline, COMMIT included: the block is still open, in
			// its failed state, for rollback to end.
			return &beforeCommitError{err}
		}
	}
	t.done = true
	t.pool.Release()
	return err
}

// beforeCommitError: a statement before the COMMIT failed; nothing was
// committed.
type beforeCommitError struct{ err error }

func (e *beforeCommitError) Error() string { return e.err.Error() }
func (e *beforeCommitError) Unwrap() error { return e.err }

// rollback ends the transaction unless it was committed. On a broken
// connection the ROLLBACK fails too; pgx then closes the connection and the
// pool replaces it.
func (t *batchTx) rollback(ctx context.Context) {
	if t.done {
		return
	}
	t.done = true
	ctx = context.WithoutCancel(ctx)
	if t.pool == nil {
		_ = t.tx.Rollback(ctx)
		return
	}
	if t.pool.Conn().PgConn().TxStatus() != 'I' {
		_ = t.tx.Rollback(ctx)
	}
	t.pool.Release()
}

// netConn is the transaction's network connection, for the handler
// watchdog to close.
func (t *batchTx) netConn() net.Conn { return t.tx.Conn().PgConn().Conn() }
