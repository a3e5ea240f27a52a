package txguard

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// statementCases are texts and what scan must find in them: the statement
// that controls the transaction ("" for none), and whether they set the
// mode of deferred constraints.
var statementCases = []struct {
	sql         string
	control     string
	constraints bool
}{
	{"COMMIT", "COMMIT", false},
	{"commit and chain", "COMMIT", false},
	{"  \n\t/* a */ -- b\n Commit", "COMMIT", false},
	{"/* nested /* comment */ still */ END", "END", false},
	{"ROLLBACK AND CHAIN", "ROLLBACK", false},
	{"ROLLBACK TO SAVEPOINT sp", "ROLLBACK", false},
	{"abort", "ABORT", false},
	{"BEGIN", "BEGIN", false},
	{"START TRANSACTION READ ONLY", "START", false},
	{"SAVEPOINT a", "SAVEPOINT", false},
	{"RELEASE SAVEPOINT a", "RELEASE", false},
	{"PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION", false},
	{"COMMIT PREPARED 'x'", "COMMIT", false},
	{"SET TRANSACTION READ ONLY", "SET TRANSACTION", false},
	{"SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "SET SESSION CHARACTERISTICS", false},
	// SET LOCAL and SET SESSION take every form of SET (gram.y).
	{"SET LOCAL TRANSACTION READ ONLY", "SET TRANSACTION", false},
	{"set session transaction isolation level serializable", "SET TRANSACTION", false},
	{"SET LOCAL SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "SET SESSION CHARACTERISTICS", false},
	{"SET SESSION SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "SET SESSION CHARACTERISTICS", false},
	{"SET SESSION statement_timeout = 0", "", false},
	{"SET SESSION AUTHORIZATION DEFAULT", "", false},
	{"SET LOCAL session_replication_role = replica", "SET SESSION_REPLICATION_ROLE", false},
	// The settings behind SET TRANSACTION, and the default that would make
	// the pooled connection's later transactions read only.
	{"SET transaction_read_only = on", "SET TRANSACTION_READ_ONLY", false},
	{"set local transaction_isolation to 'serializable'", "SET TRANSACTION_ISOLATION", false},
	{"SET SESSION transaction_deferrable = true", "SET TRANSACTION_DEFERRABLE", false},
	{"SET default_transaction_read_only = on", "SET DEFAULT_TRANSACTION_READ_ONLY", false},
	{"SET default_transaction_isolation = 'serializable'", "", false},
	{"INSERT INTO t VALUES (1); COMMIT", "COMMIT", false},
	{"ROLLBACK; INSERT INTO t VALUES (1)", "ROLLBACK", false},
	{"SELECT 1;;;COMMIT;", "COMMIT", false},
	{"SELECT 'it''s'; COMMIT", "COMMIT", false},
	{`SELECT "a""b"; COMMIT`, "COMMIT", false},
	{"SELECT $$;$$; COMMIT", "COMMIT", false},
	{"SELECT $f$ $$ ; $f$; COMMIT", "COMMIT", false},
	{"SELECT $1; COMMIT", "COMMIT", false},
	{"SELECT 1 -- ;\n; COMMIT", "COMMIT", false},
	// Ambiguous on standard_conforming_strings: off, the quote is escaped
	// and the text one string; on (the default), a COMMIT follows.
	{`SELECT 'a\'; COMMIT; --'`, "COMMIT", false},
	{`SELECT E'a\'; COMMIT; --'`, "", false},
	{"SET CONSTRAINTS ALL IMMEDIATE", "", true},
	{"set constraints all immediate; commit", "COMMIT", true},

	{"SELECT 'COMMIT'", "", false},
	{`SELECT "commit" FROM t`, "", false},
	{"SELECT 1 /* ; COMMIT */", "", false},
	{"SELECT 1 -- ; COMMIT", "", false},
	{"SELECT $$ ; COMMIT $$", "", false},
	{"SELECT $tag$ ; COMMIT $tag$", "", false},
	{"SELECT $a$ $b$ ; COMMIT $b$ $a$", "", false},
	{"SELECT E'\\' ; COMMIT'", "", false},
	{"SELECT U&'d\\0061t\\+000061' ; SELECT 2", "", false},
	{"SELECT x'1f', b'01', n'n'", "", false},
	{"DO $$ BEGIN PERFORM 1; END $$", "", false},
	{"CREATE FUNCTION f() RETURNS int LANGUAGE sql AS 'SELECT 1; COMMIT'", "", false},
	{"SET LOCAL statement_timeout = '1s'", "", false},
	{"SET search_path = public", "", false},
	{"PREPARE p AS SELECT 1", "", false},
	{"SELECT end_date, commit_id FROM t", "", false},
	{"(SELECT 1)", "", false},
	{"WITH begin AS (SELECT 1) SELECT * FROM begin", "", false},
	{"SELECT a$b$c FROM t; SELECT 1", "", false},
	{"", "", false},
	{"SELECT 'unterminated ; COMMIT", "", false},
	// A string goes on past a line break and a quote, in its own mode
	// (scan.l: quotecontinue): here the E'' string's \' escapes, and the
	// plain string after it ends at its backslash.
	{"SELECT E'a'\n'\\'' || 'x\\' ; COMMIT ; --'", "COMMIT", false},
	{"SELECT 'a'\n  -- a comment\n'b; COMMIT'", "", false},
	{"SELECT 'a' 'b'; COMMIT", "COMMIT", false},
	{"SELECT E'y' --c\n'\\'' , '\\' ; COMMIT ; SELECT '\\'' --'", "COMMIT", false}, // a comment before the break too
}

func TestScanFindsTheStatementsThatControlTheTransaction(t *testing.T) {
	t.Parallel()
	for _, tc := range statementCases {
		t.Run(tc.sql, func(t *testing.T) {
			v := scan(tc.sql)
			require.Equal(t, tc.control, v.control, "the statement that controls the transaction")
			require.Equal(t, tc.constraints, v.constraints, "SET CONSTRAINTS")
		})
	}
}

// The server is the authority on where statements begin: a text the scan
// lets through must leave the transaction it runs in where it was, same
// transaction, still open, whatever the text does (fail, say). Each text
// runs in the simple protocol, which runs every statement of a text.
func TestScanAgreesWithPostgres(t *testing.T) {
	db := testenv.NewEmptyDB(t)
	for _, tc := range statementCases {
		t.Run(tc.sql, func(t *testing.T) {
			if tc.control == "" {
				requireTransactionKept(t, db.Pool, tc.sql)
			}
		})
	}
}

// FuzzScan checks random texts against Postgres: whatever scan lets
// through runs in the transaction it was sent in and leaves it open.
func FuzzScan(f *testing.F) {
	for _, tc := range statementCases {
		f.Add(tc.sql)
	}
	db := testenv.NewEmptyDB(f)
	f.Fuzz(func(t *testing.T, sql string) {
		if strings.ContainsRune(sql, 0) || scan(sql).control != "" {
			return // a NUL ends a simple query's text before the server sees it
		}
		requireTransactionKept(t, db.Pool, sql)
	})
}

// requireTransactionKept runs sql inside a transaction, in the simple
// protocol, and requires that the transaction is still the one it was
// sent in, open or aborted.
func requireTransactionKept(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	requireTransactionKeptBy(t, pool, sql, func(ctx context.Context, tx pgx.Tx) {
		_, _ = tx.Conn().PgConn().Exec(ctx, sql).ReadAll()
	})
}

// requireTransactionKeptBy is requireTransactionKept with sql sent by send.
func requireTransactionKeptBy(t *testing.T, pool *pgxpool.Pool, sql string, send func(ctx context.Context, tx pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var before string
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text, set_config('statement_timeout', '1s', true)").Scan(&before, new(string)))
	send(ctx, tx)
	status := conn.Conn().PgConn().TxStatus()
	require.NotEqual(t, byte('I'), status, "%q ended the transaction, and the scan found no statement that does", sql)
	if status == 'E' {
		return // failed inside it: the same transaction, aborted
	}
	var after string
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&after))
	require.Equal(t, before, after, "%q moved to another transaction, and the scan found no statement that does", sql)
}

// With the simple protocol pgx writes the arguments into the text with a
// lexer of its own. Where it reads a text otherwise than the server, an
// argument could land inside what the server reads as a string, and its
// bytes become statements; the scan finds where the two part.
func TestScanFindsWherePgxReadsATextOtherwise(t *testing.T) {
	t.Parallel()
	for sql, diverges := range map[string]bool{
		`SELECT name'\' AS a, ' $1 ' AS b`:     true, // an E'' string to pgx
		`SELECT x$q$, '$q$ $1 '`:               true, // a dollar quote to pgx
		`SELECT a$$ FROM t`:                    true,
		`SELECT e'\'', $1`:                     false, // an E'' string to both
		`SELECT E'x' || $1`:                    false,
		`SELECT 1e'x'`:                         false, // 1, then E'x', to both
		`SELECT a$1 FROM t`:                    false, // a parameter to pgx: a literal then, not a string
		`SELECT name, 'e' FROM t WHERE x = $1`: false,
		`SELECT "name"'x'`:                     false,
		"SELECT E'a'\n'\\' $1 --'":             true, // the continued E'' string is a plain one to pgx
		"SELECT E'a' --c\n'\\' $1 --'":         true,
		"SELECT 'a'\n'b' || $1":                false,
		"SELECT $\uFFFD$ $1 $\uFFFD$":          true, // no tag to pgx: U+FFFD is its utf8.RuneError
	} {
		require.Equal(t, diverges, scan(sql).pgxDiverges, "%s", sql)
	}
}

// The scan counts a text's statements, and sees a text that ends inside a
// quote or a comment.
func TestScanCountsStatementsAndSeesAnOpenEnd(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]struct {
		statements int
		open       bool
	}{
		"SET CONSTRAINTS ALL IMMEDIATE":               {1, false},
		"SET CONSTRAINTS ALL IMMEDIATE;":              {1, false},
		"SET CONSTRAINTS ALL IMMEDIATE; /* c */ ;":    {1, false},
		"SET CONSTRAINTS ALL IMMEDIATE; SELECT 1":     {2, false},
		"SET CONSTRAINTS ALL IMMEDIATE -- c":          {1, false},
		"SET CONSTRAINTS ALL IMMEDIATE '":             {1, true},
		`SET CONSTRAINTS "a`:                          {1, true},
		"SET CONSTRAINTS ALL IMMEDIATE /* a /* */":    {1, true},
		"SET CONSTRAINTS ALL IMMEDIATE $x$":           {1, true},
		`SET CONSTRAINTS ALL IMMEDIATE '\'; SELECT 1`: {2, true}, // two, or one left open
	} {
		v := scan(sql)
		require.Equal(t, want.statements, v.statements, "statements of %q", sql)
		require.Equal(t, want.open, v.open, "open end of %q", sql)
	}
}

// FuzzSimpleProtocolArguments checks random texts and arguments against
// Postgres: whatever the guard sends in the simple protocol, with the
// argument written into the text by pgx, runs in the transaction it was
// sent in and leaves it open.
func FuzzSimpleProtocolArguments(f *testing.F) {
	for _, seed := range [][2]string{
		{`SELECT name'\' AS a, ' $1 ' AS b`, "; COMMIT; SELECT "},
		{`SELECT x$q$, '$q$ $1 '`, "'; COMMIT; --"},
		{`SELECT $1, '$1'`, "'; ROLLBACK AND CHAIN; SELECT '"},
		{`SELECT $1 -- $1`, "x\n; COMMIT"},
		{`SELECT E'\'' || $1`, "\\'; COMMIT; --"},
		{"SELECT E'a'\n'\\' $1 --'", "; COMMIT; --"},
		{"SELECT $\uFFFD$ $1 $\uFFFD$", "$\uFFFD$; COMMIT; SELECT $\uFFFD$"},
		{"SELECT E'a' --c\n'\\' $1 --'", "; COMMIT; --"},
	} {
		f.Add(seed[0], seed[1])
	}
	db := testenv.NewEmptyDB(f)
	f.Fuzz(func(t *testing.T, sql, arg string) {
		if strings.ContainsRune(sql+arg, 0) || !utf8.ValidString(sql+arg) || scan(sql).control != "" {
			return
		}
		requireTransactionKeptBy(t, db.Pool, sql, func(ctx context.Context, tx pgx.Tx) {
			_, _ = Wrap(tx).Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol, arg)
		})
	})
}

// In the simple protocol pgx sends a batch as one text, its queries joined
// by "\n;": a query that ends inside a quote would run into the next ones,
// and the server would run statements no query holds alone. Such a batch
// is not sent.
func TestABatchIsReadAsTheTextPgxJoinsItInto(t *testing.T) {
	db := testenv.NewEmptyDB(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
	for name, queries := range map[string][]string{
		"dollar quotes":          {"SELECT $$", "$$; COMMIT; SELECT $$", "$$"},
		"plain quotes":           {"SELECT '", "'; COMMIT; SELECT '", "'"},
		"a comment":              {"SELECT 1 /*", "*/ COMMIT; /*", "*/"},
		"a continued E'' string": {"SELECT E'x' --c\n'\\'", "z' ; COMMIT ; SELECT 1 --'"},
	} {
		t.Run(name, func(t *testing.T) {
			requireTransactionKeptBy(t, db.Pool, queries[1], func(ctx context.Context, tx pgx.Tx) {
				b := &pgx.Batch{}
				for _, q := range queries {
					b.Queue(q)
				}
				require.ErrorContains(t, Wrap(tx).SendBatch(ctx, b).Close(), "joins a batch's queries")
			})
		})
	}
}
