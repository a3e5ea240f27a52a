package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A handler sets a client encoding in which a byte pair is one character
// whose second byte is a backslash, then sends, with no arguments, a
// text that a reader of bytes takes for one string and the server for a
// string, a ROLLBACK and a second payment. The text is one Parse message,
// which the server refuses whole: nothing of it runs, the key stays in
// progress for a duplicate sent meanwhile, the request fails with nothing
// kept, and the retry pays once.
func TestNoClientEncodingSmugglesAStatementIntoARequest(t *testing.T) {
	t.Parallel()
	for enc, char := range map[string]string{"SJIS": "\x95\x5c", "BIG5": "\xa5\x5c", "GBK": "\x81\x5c"} {
		t.Run(enc, func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, nil)
			var duplicate, calls atomic.Int64
			p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				ctx := r.Context()
				if err := p.create(w, r, tx); err != nil || calls.Add(1) > 1 {
					return err // a duplicate that ran the handler pays once, and says so below
				}
				if _, err := tx.Exec(ctx, `SET LOCAL client_encoding = '`+enc+`'`); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, `SELECT E'`+char+`' AS memo; ROLLBACK; INSERT INTO `+p.table+` (amount, account) VALUES (1, 'smuggled'); SELECT 1`)
				assert.Error(t, err, "the server refuses the text")
				resp, _ := p.post("k1", "alice", `{"amount":1}`)
				duplicate.Store(int64(resp.StatusCode))
				return nil // the error ignored: the transaction is aborted all the same
			}
			resp, body := p.post("k1", "alice", `{"amount":1}`)
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
			require.EqualValues(t, http.StatusConflict, duplicate.Load(), "the duplicate finds the key in progress")
			require.EqualValues(t, 1, calls.Load(), "the handler ran once")
			require.Zero(t, p.count(), "nothing of the failed request is kept")
			require.Zero(t, p.keysStored())

			resp, body = p.post("k1", "alice", `{"amount":1}`)
			require.Equal(t, http.StatusCreated, resp.StatusCode, body)
			require.EqualValues(t, 1, p.count(), "one payment for one key")
			require.EqualValues(t, 1, p.keysStored())
		})
	}
}

// A handler that leaves the session unfit for the server's own statements
// after it (its key's row, written in the same transaction) fails its
// request: 500, nothing kept, the key free; the retry with a handler that
// does not pays once, and its key is found again by the next retry.
func TestAHandlerChangingTheSessionFailsItsRequest(t *testing.T) {
	t.Parallel()
	for name, change := range map[string]func(t *testing.T, db *testenv.DB) string{
		// The key's scope, a text argument, would be read as LATIN1 and
		// stored mangled, where the retry would not find it.
		"client_encoding LATIN1, SET LOCAL": sql(`SET LOCAL client_encoding = 'LATIN1'`),
		"client_encoding LATIN1, SET":       sql(`SET client_encoding = 'LATIN1'`),
		"client_encoding by set_config":     sql(`SELECT set_config('client_encoding', 'LATIN1', true)`),
		// A clock_timestamp of the handler's schema would stand in for
		// PostgreSQL's and store the key already expired.
		"a schema before pg_catalog": func(t *testing.T, db *testenv.DB) string {
			db.Exec(t, `CREATE FUNCTION `+db.Table("clock_timestamp")+`() RETURNS timestamptz LANGUAGE sql AS $$ SELECT timestamptz '2000-01-01' $$`)
			return `SET LOCAL search_path = ` + db.Schema + `, pg_catalog`
		},
		// replica turns off every trigger, the commit check's among them.
		"session_replication_role by set_config": sql(`SELECT set_config('session_replication_role', 'replica', true)`),
		"standard_conforming_strings off":        sql(`SET LOCAL standard_conforming_strings = off`),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newPayments(t, nil)
			stmt := change(t, p.db)
			p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if _, err := tx.Exec(r.Context(), stmt); err != nil {
					return err
				}
				return p.create(w, r, tx)
			}
			resp, body := p.post("k1", "josé", `{"amount":1}`)
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
			require.Zero(t, p.count(), "nothing of the failed request is kept")
			require.Zero(t, p.keysStored())

			p.handle = p.create
			for range 2 {
				resp, body = p.post("k1", "josé", `{"amount":1}`)
				require.Equal(t, http.StatusCreated, resp.StatusCode, body)
			}
			require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader), "the second retry finds the key")
			require.EqualValues(t, 1, p.count())
			require.EqualValues(t, 1, p.db.Int(t, `SELECT count(*) FROM `+p.db.Table("idempotency_keys")+` WHERE scope = 'josé' AND expires_at > now()`))
		})
	}
}

// sql is a change of the session made by one statement.
func sql(stmt string) func(*testing.T, *testenv.DB) string {
	return func(*testing.T, *testenv.DB) string { return stmt }
}

// What a handler may change for its own statements it may: its role, for
// row-level security (the server's statements run as the transaction
// began, here as a role the handler's may not read kafkaonce's keys
// with), a setting of its own, a statement timeout, a search_path that
// leaves pg_catalog first.
func TestAHandlerMaySetItsRoleAndSettings(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	// The role may read the schema's names (which the server's statements
	// name, and PostgreSQL reads them as it is when it prepares them)
	// and use the payments, and nothing of kafkaonce's tables.
	tenant := p.db.NewRole(t, `SELECT, INSERT ON `+p.table, `USAGE ON SEQUENCE `+p.db.Table("payments_id_seq"))
	require.Zero(t, p.db.Int(t, `SELECT count(*) FROM unnest(ARRAY['idempotency_keys', 'open_requests']) AS k(t)
		WHERE has_table_privilege($1, $2 || '.' || k.t, 'SELECT,INSERT,DELETE')`, tenant, p.db.Schema), "the tenant role may not touch kafkaonce's tables")
	p.db.Exec(t, `ALTER TABLE `+p.table+` ENABLE ROW LEVEL SECURITY`)
	p.db.Exec(t, `CREATE POLICY own ON `+p.table+` TO `+tenant+` USING (account = current_setting('app.tenant')) WITH CHECK (account = current_setting('app.tenant'))`)
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		ctx := r.Context()
		for _, sql := range []string{
			`SET LOCAL ROLE ` + tenant,
			`SELECT set_config('app.tenant', 'acme', true)`,
			`SET LOCAL statement_timeout = '5s'`,
			`SET LOCAL search_path = ` + p.db.Schema,
		} {
			if _, err := tx.Exec(ctx, sql); err != nil {
				return err
			}
		}
		return p.create(w, r, tx)
	}
	var resp *http.Response
	var body string
	for range 2 {
		resp, body = p.post("k1", "acme", `{"amount":1,"account":"acme"}`)
		require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	}
	require.Equal(t, "true", resp.Header.Get(idempotency.ReplayedHeader))
	require.EqualValues(t, 1, p.count())
	require.EqualValues(t, 1, p.keysStored())
	resp, body = p.post("k2", "acme", `{"amount":1,"account":"other"}`)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "row-level security holds for the handler's own rows: %s", body)
	require.EqualValues(t, 1, p.keysStored())
}

// What a handler obtains from tx works only during its call: a large
// object API kept by it, used after the request failed, refuses, and no
// large object is made.
func TestLargeObjectsOfARequestRefuseAfterIt(t *testing.T) {
	t.Parallel()
	p := newPayments(t, nil)
	var kept pgx.LargeObjects
	p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		kept = tx.LargeObjects()
		if _, err := kept.Create(r.Context(), 0); err != nil {
			return err
		}
		return fmt.Errorf("the request fails after making a large object")
	}
	before := p.db.Int(t, `SELECT count(*) FROM pg_largeobject_metadata`)
	resp, body := p.post("k1", "alice", `{"amount":1}`)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	_, err := kept.Create(context.Background(), 0)
	require.ErrorIs(t, err, idempotency.ErrTxCallOver)
	require.Equal(t, before, p.db.Int(t, `SELECT count(*) FROM pg_largeobject_metadata`), "no large object is kept")
}

// FuzzAHandlersBytes sends whatever bytes a handler sends, after setting
// a client encoding, between two payments, with the server as the oracle:
// every request's payments are kept with its key, or neither is, and
// nothing else is kept.
func FuzzAHandlersBytes(f *testing.F) {
	db := testenv.NewDB(f)
	table := db.Table("payments")
	db.Exec(f, `CREATE TABLE `+table+` (id bigserial PRIMARY KEY, amount bigint NOT NULL, account text NOT NULL, idem_key text NOT NULL)`)
	smuggled := `INSERT INTO ` + table + ` (amount, account, idem_key) VALUES (1, 'smuggled', 'none')`
	f.Add("SELECT E'\x95\\' AS memo; ROLLBACK; "+smuggled+"; SELECT 1", uint8(1))
	f.Add("SELECT '\xa5\\'; ROLLBACK; "+smuggled, uint8(2))
	f.Add(";COMMIT", uint8(0))
	f.Add("SET LOCAL client_encoding = 'LATIN1'", uint8(0))
	f.Add("SELECT set_config('session_replication_role', 'replica', true)", uint8(0))
	f.Add("RESET ALL", uint8(0))
	f.Add("SET CONSTRAINTS ALL IMMEDIATE; COMMIT", uint8(2))
	s, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(f, err)
	encodings := []string{"UTF8", "SJIS", "BIG5", "GBK", "GB18030", "UHC", "JOHAB", "LATIN1"}
	var n atomic.Int64
	f.Fuzz(func(t *testing.T, sql string, encoding uint8) {
		if strings.IndexByte(sql, 0) >= 0 {
			return
		}
		key := fmt.Sprintf("f-%d", n.Add(1))
		enc := encodings[int(encoding)%len(encodings)]
		h := s.HandleFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			ctx := r.Context()
			pay := func() {
				_, _ = tx.Exec(ctx, `INSERT INTO `+table+` (amount, account, idem_key) VALUES (1, 'a', $1)`, key)
			}
			pay()
			_, _ = tx.Exec(ctx, `SELECT set_config('client_encoding', $1, true)`, enc)
			_, _ = tx.Exec(ctx, sql)
			pay()
			w.WriteHeader(http.StatusCreated)
			return nil
		})
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", key)
		h.ServeHTTP(httptest.NewRecorder(), req)
		paid := db.Int(t, `SELECT count(*) FROM `+table)
		stored := db.Int(t, `SELECT count(*) FROM `+db.Table("idempotency_keys"))
		require.Equal(t, 2*stored, paid, "%q in %s: %d payments and %d keys: each request's payments are kept with its key, or neither", sql, enc, paid, stored)
		require.Zero(t, db.Sessions(t, "idle in transaction%"), "a transaction left open")
	})
}

// An Atomic phase that leaves its session unfit for the server's
// statements (its recovery point's row, written in the same transaction)
// failed, as a phase refused at COMMIT does: the run stays at its
// recovery point, and the retry resumes it there, with one charge. A text
// of two statements sent in it is refused by the server.
func TestAnAtomicPhaseChangingTheSessionFailsAndIsResumed(t *testing.T) {
	t.Parallel()
	pp := newPhasedPayments(t)
	f := pp.flow(time.Minute)
	record := f.Phases[1].Atomic
	var tries atomic.Int64
	f.Phases[1].Atomic = func(ctx context.Context, tx pgx.Tx, run *idempotency.Run) (idempotency.Step, error) {
		if tries.Add(1) == 1 {
			sp, err := tx.Begin(ctx) // the refusal aborts what it was sent in
			if err != nil {
				return idempotency.Step{}, err
			}
			_, err = sp.Exec(ctx, `SELECT 1; UPDATE `+pp.table+` SET state = 'smuggled'`)
			assert.ErrorContains(t, err, "multiple commands")
			if err := sp.Rollback(ctx); err != nil {
				return idempotency.Step{}, err
			}
			if _, err := tx.Exec(ctx, `SET LOCAL client_encoding = 'LATIN1'`); err != nil {
				return idempotency.Step{}, err
			}
		}
		return record(ctx, tx, run)
	}
	_, url := pp.serve(t, pp.db.Pool, f)
	resp, body, err := postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode, body)
	require.Equal(t, []string{"pending -"}, pp.payments(t))
	store, err := idempotency.NewStore(pp.db.Schema)
	require.NoError(t, err)
	k, err := store.Get(context.Background(), pp.db.Pool, "alice", "k-1")
	require.NoError(t, err)
	require.Equal(t, "record", k.Run.RecoveryPoint)
	require.Contains(t, k.Phased.LastError, "KO005")

	resp, body, err = postTo(t, http.DefaultClient, url, "k-1", `{"amount":5}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, body)
	require.Equal(t, []string{"charged ch_1"}, pp.payments(t))
	require.Equal(t, 1, pp.provider.madeCharges())
}

// SET CONSTRAINTS between a change of the session and the close changes
// nothing of what the close checks: a changed session user still fails
// the request (the commit check put back around it does not record what
// the transaction began as again), and a role set for row-level security,
// which may not touch kafkaonce's tables, still commits, the check lifted
// and put back, and the server's statements run, as the transaction
// began.
func TestSetConstraintsAfterAChangeOfTheSession(t *testing.T) {
	t.Parallel()
	t.Run("another session user", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t, nil)
		other := testenv.Name(t, "other")
		p.db.Exec(t, `CREATE ROLE `+other+` SUPERUSER NOLOGIN`)
		t.Cleanup(func() { p.db.Exec(t, `DROP OWNED BY `+other+`; DROP ROLE `+other) })
		for _, constraints := range []bool{false, true} {
			p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
				if _, err := tx.Exec(r.Context(), `SET SESSION AUTHORIZATION `+other); err != nil {
					return err
				}
				if constraints {
					if _, err := tx.Exec(r.Context(), `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
						return err
					}
				}
				return p.create(w, r, tx)
			}
			resp, body := p.post("k1", "alice", `{"amount":1}`)
			require.Equal(t, http.StatusInternalServerError, resp.StatusCode, "SET CONSTRAINTS %v: %s", constraints, body)
			require.Zero(t, p.count())
			require.Zero(t, p.keysStored())
		}
	})
	t.Run("a role for row-level security", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t, nil)
		tenant := p.db.NewRole(t, `SELECT, INSERT ON `+p.table, `USAGE ON SEQUENCE `+p.db.Table("payments_id_seq"))
		p.handle = func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
			ctx := r.Context()
			if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+tenant); err != nil {
				return err
			}
			if err := p.create(w, r, tx); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
				return err
			}
			var role string
			if err := tx.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
				return err
			}
			if role != tenant {
				return fmt.Errorf("the handler runs as %s after SET CONSTRAINTS, not as the role it set", role)
			}
			return nil
		}
		resp, body := p.post("k1", "alice", `{"amount":1}`)
		require.Equal(t, http.StatusCreated, resp.StatusCode, body)
		require.EqualValues(t, 1, p.count())
		require.EqualValues(t, 1, p.keysStored())
	})
}
