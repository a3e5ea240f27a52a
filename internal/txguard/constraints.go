package txguard

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A handler's SET CONSTRAINTS … IMMEDIATE fires its transaction's deferred
// checks at once, the commit check's with them; so it runs with the check
// lifted, and nothing but it may run before the check is back. The lift,
// the statement and the restore go as one pipeline in the extended
// protocol, straight to the connection (past pgx's statement cache and
// its lookup of prepared statements by name, so nothing can take the
// statement's place), each its own Parse: the server runs them in order,
// and stops at the first that fails, leaving the transaction aborted, so
// it can never commit with the check off.

// setConstraints runs c, a SET CONSTRAINTS statement, between the commit
// check's Lift and Restore.
func (t *Tx) setConstraints(ctx context.Context, c call) (pgconn.CommandTag, error) {
	if len(c.params) > 0 {
		return pgconn.CommandTag{}, errConstraintsAlone
	}
	b := &pgx.Batch{}
	t.state.check.Lift(b)
	at := len(b.QueuedQueries)
	b.Queue(c.sql)
	t.state.check.Restore(b)
	conn := t.tx.Conn()
	pipeline := &pgconn.Batch{}
	for _, q := range b.QueuedQueries {
		var eqb pgx.ExtendedQueryBuilder // one per query: the batch keeps its slices
		if err := eqb.Build(conn.TypeMap(), nil, q.Arguments); err != nil {
			return pgconn.CommandTag{}, fmt.Errorf("txguard: the commit check's statement %q: %w", q.SQL, err)
		}
		pipeline.ExecParams(q.SQL, eqb.ParamValues, nil, eqb.ParamFormats, eqb.ResultFormats)
	}
	results, err := conn.PgConn().ExecBatch(ctx, pipeline).ReadAll()
	if err != nil {
		return pgconn.CommandTag{}, fmt.Errorf("SET CONSTRAINTS, with the transaction's commit check lifted around it: %w", err)
	}
	if len(results) <= at {
		return pgconn.CommandTag{}, errors.New("SET CONSTRAINTS: the server answered fewer statements than it was sent")
	}
	return results[at].CommandTag, nil
}
