package idempotency_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
)

// transactionStatements end or reshape a transaction; a handler sends
// each with whatever follows it (here, a second payment).
var transactionStatements = []string{
	"COMMIT",
	"COMMIT AND CHAIN",
	"END",
	"ROLLBACK",
	"ROLLBACK AND CHAIN",
	"ABORT",
	"PREPARE TRANSACTION 'kafkaonce-test'",
	"BEGIN",
	"START TRANSACTION",
	"SAVEPOINT mine",
	"RELEASE SAVEPOINT mine",
	"ROLLBACK TO SAVEPOINT mine",
	"SET TRANSACTION READ ONLY",
	"SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
	"/* a comment first */ commit",
}

// How a handler can send a statement through its tx.
var sendVia = map[string]func(ctx context.Context, tx pgx.Tx, sql string) error{
	"Exec": func(ctx context.Context, tx pgx.Tx, sql string) error {
		_, err := tx.Exec(ctx, sql)
		return err
	},
	"Query": func(ctx context.Context, tx pgx.Tx, sql string) error {
		rows, err := tx.Query(ctx, sql)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	},
	"QueryRow": func(ctx context.Context, tx pgx.Tx, sql string) error {
		return tx.QueryRow(ctx, sql).Scan()
	},
	"SendBatch": func(ctx context.Context, tx pgx.Tx, sql string) error {
		b := &pgx.Batch{}
		b.Queue("SELECT 1")
		b.Queue(sql)
		return tx.SendBatch(ctx, b).Close()
	},
	"Prepare": func(ctx context.Context, tx pgx.Tx, sql string) error {
		if _, err := tx.Prepare(ctx, "handler_statement", sql); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "handler_statement")
		return err
	},
	// The bare connection passes the guard by: the database's check
	// refuses its COMMIT, and the guard sends nothing once the
	// transaction is gone.
	"the bare connection": func(ctx context.Context, tx pgx.Tx, sql string) error {
		_, err := tx.Conn().Exec(ctx, sql)
		return err
	},
}

// No statement a handler sends makes its writes durable without the
// stored key, or lets a duplicate run the key meanwhile: the handler pays,
// sends the statement (ignoring what it answers), pays again and returns
// nil, while a duplicate arrives. Through tx the statement is refused: the
// request fails and keeps nothing, the duplicate is told the key is in
// progress, and the retry pays once. On the bare connection, which the
// guard cannot see, a statement that ends the transaction frees the key
// with it, and what the handler wrote is kept exactly when its key is.
func TestAHandlersStatementsCannotEndItsTransaction(t *testing.T) {
	t.Parallel()
	for via, send := range sendVia {
		bare := via == "the bare connection"
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			for _, stmt := range transactionStatements {
				t.Run(stmt, func(t *testing.T) {
					t.Parallel()
					p := newPayments(t, nil)
					var duplicateSent atomic.Bool // once: a duplicate that ran the handler would send its own
					pay := func(ctx context.Context, tx pgx.Tx) error {
						_, err := tx.Exec(ctx, `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'a')`)
						return err
					}
					p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
						ctx := r.Context()
						if err := pay(ctx, tx); err != nil {
							return err
						}
						err := send(ctx, tx, stmt)
						if !bare {
							assert.ErrorIs(t, err, idempotency.ErrTxControlled, "%s via %s is refused", stmt, via)
						}
						if !bare && duplicateSent.CompareAndSwap(false, true) {
							resp, body := p.post("k1", "alice", `{"amount":1}`)
							assert.Equal(t, http.StatusConflict, resp.StatusCode, "a duplicate finds the key in progress: %s", body)
						}
						_ = pay(ctx, tx)
						w.WriteHeader(http.StatusCreated)
						return nil
					}
					resp, body := p.post("k1", "alice", `{"amount":1}`)
					paid, stored := p.db.Int(t, `SELECT count(*) FROM `+p.table), p.keysStored()
					if !bare || stored == 0 {
						// On the bare connection too: what the handler sent
						// fails the request again when retried, so it is
						// not the database's "try again".
						require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
						require.Zero(t, paid, "nothing the failed request wrote is kept")
						require.Zero(t, stored, "its key is free")
					}
					require.Equal(t, stored == 1, paid > 0, "the payments are kept exactly when the key is (%d payments, %d keys)", paid, stored)
					require.Equal(t, stored == 1, resp.StatusCode == http.StatusCreated, body)

					p.handle = p.create
					resp, body = p.post("k1", "alice", `{"amount":1}`)
					require.Equal(t, http.StatusCreated, resp.StatusCode, body)
					if stored == 0 {
						require.EqualValues(t, 1, p.db.Int(t, `SELECT count(*) FROM `+p.table), "the retry pays once")
					} else {
						require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader), "the retry is answered from the key")
						require.Equal(t, paid, p.db.Int(t, `SELECT count(*) FROM `+p.table))
					}
				})
			}
		})
	}
}

// A statement the guard lets through, SET CONSTRAINTS … IMMEDIATE, fires
// deferred checks early; the database's own check on the request is not
// one of them: the request commits, and a COMMIT on the bare connection
// afterwards is still refused.
func TestAHandlerMayCheckItsDeferredConstraintsEarly(t *testing.T) {
	t.Parallel()
	for _, then := range []string{"returns", "commits on the bare connection"} {
		t.Run(then, func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, nil)
			p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if _, err := tx.Exec(r.Context(), "SET CONSTRAINTS ALL IMMEDIATE"); err != nil {
					return err
				}
				if then != "returns" {
					_, _ = tx.Conn().Exec(r.Context(), "COMMIT")
				}
				return p.create(w, r, tx)
			}
			resp, body := p.post("k1", "alice", `{"amount":1}`)
			if then == "returns" {
				require.Equal(t, http.StatusCreated, resp.StatusCode, body)
				require.EqualValues(t, 1, p.keysStored())
				require.EqualValues(t, 1, p.db.Int(t, `SELECT count(*) FROM `+p.table))
				return
			}
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
			require.Zero(t, p.keysStored())
			require.Zero(t, p.db.Int(t, `SELECT count(*) FROM `+p.table))
		})
	}
}

// A constraint of the handler's tables that it deferred to COMMIT, and
// that fails there, fails the request as the handler's error would: 500,
// nothing kept, the key free; a retry that breaks nothing is run afresh.
func TestAConstraintDeferredToCommitFailsTheRequest(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	p.db.Exec(t, `ALTER TABLE `+p.table+` ADD COLUMN ref text, ADD CONSTRAINT one_per_ref UNIQUE (ref) DEFERRABLE INITIALLY DEFERRED`)
	refs := []string{"r1", "r1"}
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		for _, ref := range refs {
			if _, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account, ref) VALUES (1, 'a', $1)`, ref); err != nil {
				return err
			}
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}
	resp, body := p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	require.Empty(t, resp.Header.Get("Retry-After"), "not the database's try-again")
	require.Zero(t, p.keysStored(), "its key is free")
	require.Zero(t, p.db.Int(t, `SELECT count(*) FROM `+p.table), "nothing it wrote is kept")

	refs = []string{"r1", "r2"}
	resp, body = p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.EqualValues(t, 1, p.keysStored())
	require.EqualValues(t, 2, p.db.Int(t, `SELECT count(*) FROM `+p.table))
}
