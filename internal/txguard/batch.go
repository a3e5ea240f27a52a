package txguard

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/notx"
)

// SendBatch sends b's queries, each read as the guard reads a call (a
// QueryRewriter applied; one that controls the transaction refuses the
// whole batch before anything is sent). pgx sends a batch as a pipeline,
// a Parse per query, except on a connection whose default mode is the
// simple protocol, where it joins the queries into one text: there the
// guard sends them one at a time instead, each in the extended protocol,
// as b's results are read.
func (t *Tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if tx := t.open(); tx != t.tx {
		return tx.SendBatch(ctx, b)
	}
	for _, q := range b.QueuedQueries {
		tx, c, constraints := t.send(ctx, q.SQL, q.Arguments, true)
		if constraints {
			tx = notx.Refusing(errConstraintsAlone)
		}
		if tx != t.tx {
			return tx.SendBatch(ctx, b)
		}
		// pgx rewrites the batch's queries in place as it sends them too.
		q.SQL, q.Arguments = c.sql, c.args()
	}
	if t.state.defaultMode() == pgx.QueryExecModeSimpleProtocol {
		return &oneByOne{ctx: ctx, tx: t, queries: b.QueuedQueries}
	}
	return t.tx.SendBatch(ctx, b)
}

// oneByOne is the results of a batch sent one query at a time, each when
// its result is read, through the guard in the extended protocol. As in a
// pipeline, a query after one that failed is not sent; it fails with the
// same error.
type oneByOne struct {
	ctx     context.Context
	tx      *Tx
	queries []*pgx.QueuedQuery
	next    int
	err     error
	closed  bool
}

// errBatchRead answers a read past the batch's last query.
var errBatchRead = errors.New("no more results in the batch")

// take returns the next query, or nil and the error to answer with.
func (r *oneByOne) take() (*pgx.QueuedQuery, error) {
	switch {
	case r.closed:
		return nil, errors.New("the batch is closed")
	case r.err != nil:
		return nil, r.err
	case r.next >= len(r.queries):
		return nil, errBatchRead
	}
	q := r.queries[r.next]
	r.next++
	return q, nil
}

// args are a queued query's arguments for a call: in a batch pgx reads no
// option (the guard applied the rewriter), so the mode comes first.
func args(q *pgx.QueuedQuery) []any {
	return append([]any{pgx.QueryExecModeExec}, q.Arguments...)
}

func (r *oneByOne) Exec() (pgconn.CommandTag, error) {
	q, err := r.take()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := r.tx.Exec(r.ctx, q.SQL, args(q)...)
	r.fail(err)
	return tag, err
}

func (r *oneByOne) Query() (pgx.Rows, error) {
	q, err := r.take()
	if err != nil {
		return notx.Refusing(err).Query(r.ctx, "")
	}
	rows, err := r.tx.Query(r.ctx, q.SQL, args(q)...)
	r.fail(err)
	return &failOnClose{Rows: rows, r: r}, err
}

func (r *oneByOne) QueryRow() pgx.Row {
	rows, err := r.Query()
	return rowOf{rows: rows, err: err}
}

// Close sends the queries not read yet, calling their callbacks, and
// returns the first error.
func (r *oneByOne) Close() error {
	if r.closed {
		return r.err
	}
	for r.err == nil && r.next < len(r.queries) {
		q := r.queries[r.next]
		var err error
		if q.Fn != nil {
			err = q.Fn(r)
		} else {
			_, err = r.Exec()
		}
		r.fail(err)
	}
	r.closed = true
	return r.err
}

// Tx is nil: a batch sent through a transaction begins none.
func (r *oneByOne) Tx() pgx.Tx { return nil }

func (r *oneByOne) fail(err error) {
	if err != nil && r.err == nil {
		r.err = err
	}
}

// failOnClose records the error a query's rows end with.
type failOnClose struct {
	pgx.Rows
	r *oneByOne
}

func (f *failOnClose) Close() {
	f.Rows.Close()
	f.r.fail(f.Rows.Err())
}

// rowOf is pgx's QueryRow over rows: the first row scanned, ErrNoRows
// when there is none, the rows closed.
type rowOf struct {
	rows pgx.Rows
	err  error
}

func (r rowOf) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

var _ pgx.BatchResults = (*oneByOne)(nil)
