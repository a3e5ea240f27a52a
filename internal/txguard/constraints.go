package txguard

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A handler's SET CONSTRAINTS … IMMEDIATE fires its transaction's deferred
// checks at once, the commit check's trigger with them; so it runs with
// the check lifted, and nothing but it may run before the check is back.
// That is why it goes alone (one statement, no arguments), and why the
// lift, the statement and the restore go as one text in the simple
// protocol on the bare connection, past pgx's statement handling: nothing
// there can swap the statement for another (a statement prepared on the
// connection under the same name as the text, a QueryRewriter), and the
// server runs the three or none. A statement that fails aborts the
// transaction, which then can never commit.

// setConstraints runs c, a SET CONSTRAINTS statement whose text's scan
// is v, between the commit check's Lift and Restore.
func (t *Tx) setConstraints(ctx context.Context, c call, v verdict) (pgconn.CommandTag, error) {
	if c.params > 0 || v.statements != 1 || v.open {
		return pgconn.CommandTag{}, errConstraintsAlone
	}
	lift, restore := &pgx.Batch{}, &pgx.Batch{}
	t.state.check.Lift(lift)
	t.state.check.Restore(restore)
	var text strings.Builder
	for _, q := range lift.QueuedQueries {
		if err := appendStatement(&text, q); err != nil {
			return pgconn.CommandTag{}, err
		}
	}
	if err := appendStatement(&text, &pgx.QueuedQuery{SQL: c.sql}); err != nil {
		return pgconn.CommandTag{}, err
	}
	for _, q := range restore.QueuedQueries {
		if err := appendStatement(&text, q); err != nil {
			return pgconn.CommandTag{}, err
		}
	}
	results, err := t.tx.Conn().PgConn().Exec(ctx, text.String()).ReadAll()
	if err != nil {
		return pgconn.CommandTag{}, fmt.Errorf("SET CONSTRAINTS, with the transaction's commit check lifted around it: %w", err)
	}
	at := len(lift.QueuedQueries)
	if len(results) <= at {
		return pgconn.CommandTag{}, errors.New("SET CONSTRAINTS: the server answered fewer statements than it was sent")
	}
	return results[at].CommandTag, nil
}

// appendStatement adds q to a text of statements run in the simple
// protocol; q takes no arguments. The newline ends a line comment q may
// end with.
func appendStatement(text *strings.Builder, q *pgx.QueuedQuery) error {
	if len(q.Arguments) > 0 {
		return fmt.Errorf("txguard: the commit check's statement %q takes arguments; it must not", q.SQL)
	}
	if text.Len() > 0 {
		text.WriteString("\n;")
	}
	text.WriteString(q.SQL)
	return nil
}
