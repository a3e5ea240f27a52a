package idempotency

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
)

// commitCheck is the database's half of "only the server commits a
// request's transaction" (migration 017): every transaction the server
// begins opens with a row in open_requests that cannot be committed (a
// foreign key, checked at COMMIT, to a table that stays empty), and the
// server's closing round trip deletes it first, so a COMMIT the server did
// not send finds the row and is refused. The guard around the handler's
// pgx.Tx is the other half: it sends no statement that would end the
// transaction, and hands out no bare connection.
type commitCheck struct {
	open, openUnlessStored, reopen, lift, close, deferred string
	asBegan, asHandler                                    string
	guard                                                 *txguard.CommitCheck
}

func newCommitCheck(schemaName, keysTable string) *commitCheck {
	requests := schema.Table(schemaName, "open_requests")
	// The row's ctid is kept in a setting of the transaction, for the
	// close to find the row without an index, with the role and the
	// session user the transaction began with, which the close checks
	// and puts back (see schema.AfterUserCode).
	reopened := `SELECT set_config('kafkaonce.open_request', ctid::text, true) FROM opened`
	opened := `SELECT set_config('kafkaonce.open_request', ctid::text, true), ` + schema.BeganAs + ` FROM opened`
	insert := `WITH opened AS (INSERT INTO ` + requests + ` DEFAULT VALUES RETURNING ctid) `
	closeRequest := schema.Table(schemaName, "close_request")
	c := &commitCheck{
		open: insert + opened,
		openUnlessStored: `WITH opened AS (INSERT INTO ` + requests + ` (backend) SELECT pg_backend_pid() WHERE NOT EXISTS (
			SELECT FROM ` + keysTable + ` WHERE scope = $1 AND idem_key = $2 AND status IS NOT NULL AND expires_at > clock_timestamp())
			RETURNING ctid) ` + opened,
		// Around a handler's SET CONSTRAINTS the row is put back, and what
		// the transaction began as is not recorded again: it is the
		// handler's by then.
		reopen:    insert + reopened,
		asBegan:   schema.AsBegan(schemaName),
		asHandler: schema.AsHandler(schemaName),
		// The close checks the session the handler left first (migration
		// 022); lifting the check around a handler's SET CONSTRAINTS only
		// deletes the row, in the middle of the handler's work, whose
		// settings it leaves as they are.
		close:    `SELECT ` + closeRequest + `(pg_catalog.current_schemas(true))`,
		lift:     `SELECT ` + closeRequest + `()`,
		deferred: `SET CONSTRAINTS ` + schema.Table(schemaName, "open_requests_closed_at_commit") + ` DEFERRED`,
	}
	// Around a handler's SET CONSTRAINTS … IMMEDIATE: the row goes (so the
	// check that statement fires finds nothing to refuse), then the check
	// is deferred again and a row is back; each as the role the
	// transaction began with (the handler's may not touch open_requests).
	c.guard = &txguard.CommitCheck{
		Lift: func(b *pgx.Batch) {
			b.Queue(c.asBegan)
			b.Queue(c.lift)
			b.Queue(c.asHandler)
		},
		Restore: func(b *pgx.Batch) {
			b.Queue(c.asBegan)
			b.Queue(c.deferred)
			b.Queue(c.reopen)
			b.Queue(c.asHandler)
		},
	}
	return c
}

// queueOpen adds the opening of the check to b, a transaction's first
// round trip.
func (c *commitCheck) queueOpen(b *pgx.Batch) { b.Queue(c.open) }

// queueOpenUnlessStored adds the opening of the check to b, a claim's
// round trip, after the key's read: unless the key is stored (completed,
// and not expired). Such a request is answered from the row and its
// transaction rolled back, never committed, so a replay writes nothing:
// no row, no transaction id. A key stored between the read and this
// statement cannot be (this request holds the key's lock, or, without
// it, goes no further than answering 409), and one that expires between
// them is opened, which only costs the write.
func (c *commitCheck) queueOpenUnlessStored(b *pgx.Batch, scope, key string) {
	b.Queue(c.openUnlessStored, scope, key)
}

// queueClose adds its closing to b, the last round trip, before the
// COMMIT: it fails (KO005) when the handler left the session unfit for the
// server's statements (see schema.AfterUserCode), and (KO004) when the
// transaction is not the one opened.
func (c *commitCheck) queueClose(b *pgx.Batch) { b.Queue(c.close) }

// requestNotOpen is the SQLSTATE the close raises when the transaction is
// not the one the server opened. (A COMMIT before the close fails with
// 23503, foreign_key_violation, on open_requests_closed_at_commit.)
const requestNotOpen = "KO004"

// handlersFault reports whether err, from the closing round trip, is the
// handler's doing rather than the database's: requestNotOpen (the
// transaction is not the one the server opened), schema.SessionChanged
// (the handler changed a setting the server's statements rely on), an
// integrity constraint (class 23) its tables deferred to COMMIT, or a
// state it left the transaction in (class 25: made read-only with
// set_config, say). A retry meets any of them again, so none is answered
// "try again": each is the request's failure, like an error the handler
// returned.
func handlersFault(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	switch {
	case pg.Code == "25P03", pg.Code == "25P04":
		// idle_in_transaction_session_timeout, transaction_timeout: the
		// server ended the session; a retry that is quicker gets through.
		return false
	case pg.Code == requestNotOpen, pg.Code == schema.SessionChanged, strings.HasPrefix(pg.Code, "23"), strings.HasPrefix(pg.Code, "25"):
		return true
	}
	return false
}
