package idempotency_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	";COMMIT", // an empty statement first, which the server drops
	"ROLLBACK; INSERT INTO nowhere VALUES (1)",
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
}

// No statement a handler sends makes its writes durable without the
// stored key, or lets a duplicate run the key meanwhile: the handler pays,
// sends the statement (ignoring what it answers), pays again and returns
// nil, while a duplicate arrives. Through tx the statement is refused: the
// request fails and keeps nothing, the duplicate is told the key is in
// progress, and the retry pays once. On the connection under tx, reached
// around the guard (tx.Conn() is nil: code that got hold of it some other
// way), a statement that ends the transaction frees the key with it, and
// what the handler wrote is kept exactly when its key is: the database
// refuses a COMMIT the server did not send.
func TestAHandlersStatementsCannotEndItsTransaction(t *testing.T) {
	t.Parallel()
	var bareConns testenv.BareConns
	ways := maps.Clone(sendVia)
	ways["the connection, around the guard"] = func(ctx context.Context, tx pgx.Tx, sql string) error {
		conn, err := bareConns.Of(ctx, tx)
		if err != nil {
			return err
		}
		_, err = conn.Exec(ctx, sql)
		return err
	}
	for via, send := range ways {
		bare := via == "the connection, around the guard"
		t.Run(via, func(t *testing.T) {
			t.Parallel()
			for _, stmt := range transactionStatements {
				t.Run(stmt, func(t *testing.T) {
					t.Parallel()
					p := newPaymentsOn(t, testenv.NewDB(t, bareConns.Option()), nil)
					var duplicateSent atomic.Bool // once: a duplicate that ran the handler would send its own
					pay := func(ctx context.Context, tx pgx.Tx) error {
						_, err := tx.Exec(ctx, `INSERT INTO `+p.table+` (amount, account) VALUES (1, 'a')`)
						return err
					}
					p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
						ctx := r.Context()
						assert.Nil(t, tx.Conn(), "the bare connection is not handed out")
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
						// Around the guard too: what the handler sent
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
// one of them: the request commits, and a COMMIT sent afterwards on the
// connection, around the guard, is still refused.
func TestAHandlerMayCheckItsDeferredConstraintsEarly(t *testing.T) {
	t.Parallel()
	for _, then := range []string{"returns", "commits around the guard"} {
		t.Run(then, func(t *testing.T) {
			t.Parallel()
			var bareConns testenv.BareConns
			p := newPaymentsOn(t, testenv.NewDB(t, bareConns.Option()), nil)
			p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if _, err := tx.Exec(r.Context(), "SET CONSTRAINTS ALL IMMEDIATE"); err != nil {
					return err
				}
				if then != "returns" {
					conn, err := bareConns.Of(r.Context(), tx)
					if err != nil {
						return err
					}
					_, _ = conn.Exec(r.Context(), "COMMIT")
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
// while it is: the lift, the statement and the restore go as one
// pipeline, each its own Parse, so a text with more in it is refused by
// the server and aborts the transaction; sent other than alone by Exec it
// is not sent; and nothing takes its place (a rewriter, a statement
// prepared on the connection under its text). The handler pays, tries,
// then commits on the connection, around the guard: the check, back in
// place or never lifted, refuses that COMMIT.
func TestSetConstraintsRunsAloneWhileTheCheckIsLifted(t *testing.T) {
	t.Parallel()
	const immediate = "SET CONSTRAINTS ALL IMMEDIATE"
	exec := func(sql string, args ...any) func(ctx context.Context, tx pgx.Tx, _ *pgx.Conn) error {
		return func(ctx context.Context, tx pgx.Tx, _ *pgx.Conn) error {
			_, err := tx.Exec(ctx, sql, args...)
			return err
		}
	}
	const byServer = "(SQLSTATE" // the server's refusal, which aborts the transaction
	for name, try := range map[string]struct {
		send    func(ctx context.Context, tx pgx.Tx, bare *pgx.Conn) error
		refusal string // "" when it runs
	}{
		"in a batch": {func(ctx context.Context, tx pgx.Tx, _ *pgx.Conn) error {
			b := &pgx.Batch{}
			b.Queue(immediate)
			b.Queue("SELECT 1", rewriteTo("COMMIT"))
			return tx.SendBatch(ctx, b).Close()
		}, "on its own"},
		"in a batch with a statement prepared on the connection": {func(ctx context.Context, tx pgx.Tx, bare *pgx.Conn) error {
			if _, err := bare.Prepare(ctx, "c", "COMMIT"); err != nil {
				return err
			}
			b := &pgx.Batch{}
			b.Queue(immediate)
			b.Queue("c")
			return tx.SendBatch(ctx, b).Close()
		}, "on its own"},
		"with a rewriter":           {exec(immediate, rewriteTo("COMMIT")), "COMMIT"},
		"rewritten to more":         {exec(immediate, rewriteTo(immediate+"; COMMIT")), byServer},
		"with a statement after it": {exec(immediate + "; SELECT 1"), byServer},
		"with arguments":            {exec(immediate, 1), "on its own"},
		"ending inside a string":    {exec(immediate + " '"), byServer},
		"ending inside a comment":   {exec(immediate + " /* "), byServer},
		"ending in a line comment":  {exec(immediate + " -- checked"), ""},
		"by Query":                  {func(ctx context.Context, tx pgx.Tx, _ *pgx.Conn) error { return tx.QueryRow(ctx, immediate).Scan() }, "on its own"},
		"under a prepared COMMIT's name": {func(ctx context.Context, tx pgx.Tx, bare *pgx.Conn) error {
			if _, err := bare.Prepare(ctx, immediate, "COMMIT"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, immediate)
			return err
		}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var bareConns testenv.BareConns
			p := newPaymentsOn(t, testenv.NewDB(t, bareConns.Option()), nil)
			status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				ctx := r.Context()
				bare, err := bareConns.Of(ctx, tx)
				if err != nil {
					return err
				}
				if err := p.create(w, r, tx); err != nil {
					return err
				}
				err = try.send(ctx, tx, bare)
				if try.refusal == "" {
					assert.NoError(t, err)
				} else {
					assert.ErrorContains(t, err, try.refusal)
				}
				_, _ = bare.Exec(ctx, "COMMIT")
				return nil
			})
			require.Equal(t, http.StatusInternalServerError, status, "the COMMIT around the guard is refused")
		})
	}
}

// In the simple protocol pgx would write the arguments into the text, with
// a lexer of its own that reads some texts otherwise than the server (to
// it, name'\' opens an E'…' string), so that an argument could become
// statements. The guard sends such a call in the extended protocol
// instead, the arguments apart from the text: the server reads the text
// alone, refuses what does not hold together, and runs no argument; a
// sound statement runs with its arguments.
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
				sp, err := tx.Begin(ctx) // the refusals abort the savepoint, not the request
				if err != nil {
					return err
				}
				_, err = sp.Exec(ctx, divergent, append(args, injected)...)
				var pgErr *pgconn.PgError
				assert.ErrorAs(t, err, &pgErr, "the server refuses the text")
				if err := sp.Rollback(ctx); err != nil {
					return err
				}
				if args == nil { // a batch goes in the pool's mode
					sp, err := tx.Begin(ctx)
					if err != nil {
						return err
					}
					b := &pgx.Batch{}
					b.Queue(divergent, injected)
					assert.ErrorAs(t, sp.SendBatch(ctx, b).Close(), &pgErr)
					if err := sp.Rollback(ctx); err != nil {
						return err
					}
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
// then commits on the connection, around the guard, is refused as any
// other, and the request fails with nothing kept.
func TestResetSettingsLeaveTheCommitCheckInPlace(t *testing.T) {
	t.Parallel()
	for _, reset := range []string{"RESET ALL", "RESET kafkaonce.open_request", "SET kafkaonce.open_request TO DEFAULT", "SET LOCAL kafkaonce.open_request = ''"} {
		t.Run(reset, func(t *testing.T) {
			t.Parallel()
			var bareConns testenv.BareConns
			p := newPaymentsOn(t, testenv.NewDB(t, bareConns.Option()), nil)
			status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				bare, err := bareConns.Of(r.Context(), tx)
				if err != nil {
					return err
				}
				if err := p.create(w, r, tx); err != nil {
					return err
				}
				if _, err := tx.Exec(r.Context(), reset); err != nil {
					return err
				}
				_, _ = bare.Exec(r.Context(), "COMMIT")
				return nil
			})
			require.Equal(t, http.StatusInternalServerError, status)
		})
	}
}

// In the simple protocol (the pool's default) pgx would send a batch as
// one text, its queries joined: the guard sends them one at a time
// instead, so queries that would run into each other once joined (and
// end the request's transaction) are each refused by the server alone.
func TestABatchInTheSimpleProtocolGoesOneQueryAtATime(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
	p := newPaymentsOn(t, db, nil)
	status := p.requireKeptOnlyWithTheKey(t, func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue("SELECT $$")
		b.Queue("$$; ROLLBACK; INSERT INTO " + p.table + " (amount, account) VALUES (1, 'a'); COMMIT; BEGIN; SELECT $$")
		b.Queue("$$")
		err := tx.SendBatch(r.Context(), b).Close()
		var pgErr *pgconn.PgError
		assert.ErrorAs(t, err, &pgErr, "the server refuses the first query alone")
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

// keepConn is a pgx.QueryRewriter that changes nothing, and keeps the
// connection it is handed.
type keepConn struct{ got **pgx.Conn }

func (k keepConn) RewriteQuery(_ context.Context, conn *pgx.Conn, sql string, args []any) (string, []any, error) {
	*k.got = conn
	return sql, args, nil
}

// A QueryRewriter is applied by the guard, which hands it no connection:
// the bare connection, kept past the request, would run statements in
// whatever transaction the pooled connection holds next.
func TestARewriterGetsNoConnection(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	var kept *pgx.Conn
	handed := false
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Exec(r.Context(), `SELECT $1::int`, keepConn{&kept}, 1); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`SELECT $1::int`, keepConn{&kept}, 2)
		if err := tx.SendBatch(r.Context(), b).Close(); err != nil {
			return err
		}
		handed = kept != nil
		return p.create(w, r, tx)
	}
	resp, body := p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.False(t, handed, "a rewriter was handed the connection")
}

// pgx runs the statement prepared under a name in place of any text equal
// to it, for the rest of the session: a handler's statement prepared as
// "COMMIT" would stand in for the server's own COMMIT, which would then
// commit nothing, of this request or of the next ones on the connection.
// Such a name is refused, and the request fails with nothing kept; a name
// no text can be is prepared, and runs by its name.
func TestAStatementPreparedUnderAStatementsNameIsRefused(t *testing.T) {
	t.Parallel()
	p := newPaymentsOn(t, testenv.NewDB(t, testenv.MaxConns(1)), nil)
	for i, name := range []string{"COMMIT", "commit", "rollback", "BEGIN", "End", "SELECT 1", "a b", "x;", "stmt$1", "é"} {
		p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			_, err := tx.Prepare(r.Context(), name, "SELECT 1")
			assert.ErrorIs(t, err, idempotency.ErrTxControlled, "%q", name)
			if err := p.create(w, r, tx); err != nil {
				return err
			}
			return err
		}
		resp, body := p.post(fmt.Sprintf("k-%d", i), "mallory", `{"amount":1}`)
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "%q: %s", name, body)
	}
	require.Zero(t, p.count())
	require.Zero(t, p.keysStored())

	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := tx.Prepare(r.Context(), "insert_payment", `INSERT INTO `+p.table+` (amount, account) VALUES ($1, $2)`); err != nil {
			return err
		}
		if _, err := tx.Exec(r.Context(), "insert_payment", 1, "a"); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}
	resp, body := p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	p.handle = p.create // the same pooled connection
	resp, body = p.post("k2", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.EqualValues(t, 2, p.count())
	require.EqualValues(t, 2, p.keysStored())
}
