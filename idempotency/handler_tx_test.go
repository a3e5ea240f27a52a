package idempotency_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
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
	"SET LOCAL TRANSACTION READ ONLY",
	"SET SESSION TRANSACTION READ ONLY",
	"SET LOCAL SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
	"SET LOCAL session_replication_role = replica",
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

// rewriteTo is a pgx.QueryRewriter (the interface pgx.NamedArgs
// implements): pgx sends the text it returns instead of the one given.
type rewriteTo string

func (r rewriteTo) RewriteQuery(_ context.Context, _ *pgx.Conn, _ string, args []any) (string, []any, error) {
	return string(r), args, nil
}

// requireKeptOnlyWithTheKey posts with handle, then retries with a handler
// that pays: the first request's payments are kept exactly when its key
// is, and the retry pays once in all.
func (p *payments) requireKeptOnlyWithTheKey(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error) (status int) {
	t.Helper()
	p.handle = handle
	resp, body := p.post("k1", "alice", `{"amount":1}`)
	paid, stored := p.db.Int(t, `SELECT count(*) FROM `+p.table), p.keysStored()
	require.Equal(t, stored == 1, paid > 0, "the payments are kept exactly when the key is (%d payments, %d keys): %d %s", paid, stored, resp.StatusCode, body)
	p.handle = p.create
	retry, body := p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, retry.StatusCode, body)
	require.EqualValues(t, max(paid, 1), p.db.Int(t, `SELECT count(*) FROM `+p.table), "the retry pays once in all")
	return resp.StatusCode
}

// The guard reads the text pgx sends: the one a QueryRewriter among the
// arguments returns. A COMMIT so returned is refused as any other, by
// every method; named arguments run as pgx runs them.
func TestTheGuardReadsTheTextARewriterReturns(t *testing.T) {
	t.Parallel()
	for via, send := range map[string]func(ctx context.Context, tx pgx.Tx) error{
		"Exec": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1", rewriteTo("COMMIT"))
			return err
		},
		"Exec with a mode first": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1", pgx.QueryExecModeExec, rewriteTo("COMMIT"))
			return err
		},
		"Query": func(ctx context.Context, tx pgx.Tx) error {
			rows, err := tx.Query(ctx, "SELECT 1", rewriteTo("COMMIT"))
			if err != nil {
				return err
			}
			rows.Close()
			return rows.Err()
		},
		"QueryRow": func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT 1", rewriteTo("COMMIT")).Scan()
		},
		"SendBatch": func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("SELECT 1")
			b.Queue("SELECT 1", rewriteTo("ROLLBACK AND CHAIN"))
			return tx.SendBatch(ctx, b).Close()
		},
		"a rewriter that returns another": func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1", rewriteTo("SELECT $1"), rewriteTo("COMMIT"))
			return err
		},
	} {
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, nil)
			status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if err := p.create(w, r, tx); err != nil {
					return err
				}
				assert.ErrorIs(t, send(r.Context(), tx), idempotency.ErrTxControlled)
				return nil
			})
			require.Equal(t, http.StatusInternalServerError, status)
		})
	}
	t.Run("named arguments", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t, nil)
		status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), `INSERT INTO `+p.table+` (amount, account) VALUES (@amount, @account)`, pgx.NamedArgs{"amount": 1, "account": "a"})
			w.WriteHeader(http.StatusCreated)
			return err
		})
		require.Equal(t, http.StatusCreated, status)
	})
}

// SET CONSTRAINTS runs with the commit check lifted, and nothing else runs
// while it is: sent other than alone by Exec it is not sent, and nothing
// takes its place (a rewriter, a statement prepared on the bare
// connection under its text). The handler pays, tries, then commits on
// the bare connection, which the check refuses.
func TestSetConstraintsRunsAloneWhileTheCheckIsLifted(t *testing.T) {
	t.Parallel()
	const immediate = "SET CONSTRAINTS ALL IMMEDIATE"
	exec := func(sql string, args ...any) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, sql, args...)
			return err
		}
	}
	for name, try := range map[string]struct {
		send    func(ctx context.Context, tx pgx.Tx) error
		refusal string // "" when it runs
	}{
		"in a batch": {func(ctx context.Context, tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue(immediate)
			b.Queue("SELECT 1", rewriteTo("COMMIT"))
			return tx.SendBatch(ctx, b).Close()
		}, "on its own"},
		"in a batch with a statement prepared on the bare connection": {func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Conn().Prepare(ctx, "c", "COMMIT"); err != nil {
				return err
			}
			b := &pgx.Batch{}
			b.Queue(immediate)
			b.Queue("c")
			return tx.SendBatch(ctx, b).Close()
		}, "on its own"},
		"with a rewriter":           {exec(immediate, rewriteTo("COMMIT")), "COMMIT statement"},
		"rewritten to more":         {exec(immediate, rewriteTo(immediate+"; COMMIT")), "COMMIT statement"},
		"with a statement after it": {exec(immediate + "; SELECT 1"), "on its own"},
		"with arguments":            {exec(immediate, 1), "on its own"},
		"ending inside a string":    {exec(immediate + " '"), "on its own"},
		"ending inside a comment":   {exec(immediate + " /* "), "on its own"},
		"ending in a line comment":  {exec(immediate + " -- checked"), ""},
		"by Query":                  {func(ctx context.Context, tx pgx.Tx) error { return tx.QueryRow(ctx, immediate).Scan() }, "on its own"},
		"under a prepared COMMIT's name": {func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Conn().Prepare(ctx, immediate, "COMMIT"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, immediate)
			return err
		}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, nil)
			status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				ctx := r.Context()
				if err := p.create(w, r, tx); err != nil {
					return err
				}
				err := try.send(ctx, tx)
				if try.refusal == "" {
					assert.NoError(t, err)
				} else {
					assert.ErrorContains(t, err, try.refusal)
				}
				_, _ = tx.Conn().Exec(ctx, "COMMIT")
				return nil
			})
			require.Equal(t, http.StatusInternalServerError, status, "the bare COMMIT is refused")
		})
	}
}

// With the simple protocol pgx writes the arguments into the text, and its
// lexer is not the server's: to it, name'\' opens an E'…' string. A text
// the two read otherwise is not sent, since an argument could become
// statements there (here, a COMMIT); a text they read alike runs with its
// arguments.
func TestTheSimpleProtocolCannotTurnAnArgumentIntoStatements(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ mode, divergent, injected string }{
		{"chosen by the call", `SELECT name'\' AS a, ' $1 ' AS b`, "; COMMIT; SELECT "},
		{"the pool's default", `SELECT name'\' AS a, ' $1 ' AS b`, "; COMMIT; SELECT "},
		// An E'' string continued on the next line is one E'' string to
		// the server, and a plain string to pgx.
		{"chosen by the call", "SELECT E'memo'\n'\\' || $1", "); ROLLBACK; INSERT INTO t VALUES (666); COMMIT; BEGIN; --"},
		{"chosen by the call", "SELECT E'memo' -- a comment first\n'\\' || $1", "); ROLLBACK; INSERT INTO t VALUES (666); COMMIT; BEGIN; --"},
	} {
		mode, divergent, injected := tc.mode, tc.divergent, tc.injected
		t.Run(mode+": "+divergent, func(t *testing.T) {
			t.Parallel()
			var args []any
			var db *testenv.DB
			if mode == "chosen by the call" {
				db, args = testenv.NewDB(t), []any{pgx.QueryExecModeSimpleProtocol}
			} else {
				db = testenv.NewDB(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
			}
			p := newPaymentsOn(t, db, nil)
			status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				ctx := r.Context()
				_, err := tx.Exec(ctx, divergent, append(args, injected)...)
				assert.ErrorContains(t, err, "simple protocol")
				if args == nil { // a batch goes in the pool's mode
					b := &pgx.Batch{}
					b.Queue(divergent, injected)
					assert.ErrorContains(t, tx.SendBatch(ctx, b).Close(), "simple protocol")
				}
				if _, err := tx.Exec(ctx, `INSERT INTO `+p.table+` (amount, account) VALUES ($1, $2)`, append(args, 1, "it's")...); err != nil {
					return err
				}
				w.WriteHeader(http.StatusCreated)
				return nil
			})
			require.Equal(t, http.StatusCreated, status)
			require.EqualValues(t, 1, p.db.Int(t, `SELECT count(*) FROM `+p.table+` WHERE account = 'it''s'`))
		})
	}
}

// A replay opens no commit check: its transaction only reads, and rolls
// back, so it writes nothing (not even a transaction id is taken). A
// sequence, which no rollback undoes, counts the checks opened.
func TestAReplayOpensNoCommitCheck(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	resp, body := p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	opens := p.db.Table("opens")
	p.db.Exec(t, `CREATE SEQUENCE `+opens)
	p.db.Exec(t, `CREATE FUNCTION `+p.db.Table("count_open")+`() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM nextval('`+opens+`'); RETURN NULL; END $$`)
	p.db.Exec(t, `CREATE TRIGGER count_opens AFTER INSERT ON `+p.db.Table("open_requests")+` FOR EACH ROW EXECUTE FUNCTION `+p.db.Table("count_open")+`()`)
	opened := func() int64 { return p.db.Int(t, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+opens) }
	for range 3 {
		resp, body = p.post("k1", "alice", `{"amount":1}`)
		require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader), body)
	}
	require.Zero(t, opened(), "a replay opened the commit check")
	resp, body = p.post("k2", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.EqualValues(t, 1, opened(), "a new key opens it")
}

// The commit check's row cannot be committed, whatever the transaction's
// settings say: a handler that resets them through tx (RESET ALL) and
// then commits on the bare connection is refused as any other, and the
// request fails with nothing kept.
func TestResetSettingsLeaveTheCommitCheckInPlace(t *testing.T) {
	t.Parallel()
	for _, reset := range []string{"RESET ALL", "RESET kafkaonce.open_request", "SET kafkaonce.open_request TO DEFAULT", "SET LOCAL kafkaonce.open_request = ''"} {
		t.Run(reset, func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, nil)
			status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if err := p.create(w, r, tx); err != nil {
					return err
				}
				if _, err := tx.Exec(r.Context(), reset); err != nil {
					return err
				}
				_, _ = tx.Conn().Exec(r.Context(), "COMMIT")
				return nil
			})
			require.Equal(t, http.StatusInternalServerError, status)
		})
	}
}

// In the simple protocol (the pool's default) pgx sends a batch as one
// text, its queries joined: a batch one of whose queries ends inside a
// quote, so that joined they would end the request's transaction, is not
// sent.
func TestABatchInTheSimpleProtocolIsReadAsPgxJoinsIt(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
	p := newPaymentsOn(t, db, nil)
	status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue("SELECT $$")
		b.Queue("$$; ROLLBACK; INSERT INTO " + p.table + " (amount, account) VALUES (1, 'a'); COMMIT; BEGIN; SELECT $$")
		b.Queue("$$")
		err := tx.SendBatch(r.Context(), b).Close()
		assert.ErrorContains(t, err, "joins a batch's queries")
		return err
	})
	require.Equal(t, http.StatusInternalServerError, status)
}

// A transaction the server ended for idling past
// IdleInTransactionTimeout (25P03, and the connection with it) is the
// database's "try again": a retry that does not idle gets through.
func TestATransactionEndedForIdlingIsTryAgain(t *testing.T) {
	t.Parallel()
	p := newPayments(t, &idempotency.Config{IdleInTransactionTimeout: time.Second})
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if err := p.create(w, r, tx); err != nil {
			return err
		}
		time.Sleep(2 * time.Second) // idle in the transaction, past its timeout
		return nil
	}
	resp, body := p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, body)
	require.Zero(t, p.keysStored())
	p.handle = p.create
	resp, body = p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
}
