package txguard

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// kindCases are texts of one statement and what the guard makes of them:
// the statement that controls the transaction ("" for none), and whether
// it is SET CONSTRAINTS. A text of several statements is the server's to
// refuse; its first decides here.
var kindCases = []struct {
	sql         string
	control     string
	constraints bool
}{
	{"COMMIT", "COMMIT", false},
	{"commit and chain", "COMMIT", false},
	{"  \n\t/* a */ -- b\n Commit", "COMMIT", false},
	{"/* nested /* comment */ still */ END", "END", false},
	{"-- a line comment ended by a carriage return\rCOMMIT", "COMMIT", false},
	{"\vCOMMIT", "COMMIT", false},   // PostgreSQL 16 reads \v as a space, 15 as an error
	{"\x01COMMIT", "COMMIT", false}, // an error to the server: refused all the same
	{";COMMIT", "COMMIT", false},    // an empty statement first: the server drops it
	{" ; ;; /* */ ; rollback", "ROLLBACK", false},
	{"ROLLBACK AND CHAIN", "ROLLBACK", false},
	{"ROLLBACK TO SAVEPOINT sp", "ROLLBACK", false},
	{"abort", "ABORT", false},
	{"BEGIN", "BEGIN", false},
	{"START TRANSACTION READ ONLY", "START", false},
	{"SAVEPOINT a", "SAVEPOINT", false},
	{"RELEASE SAVEPOINT a", "RELEASE", false},
	{"PREPARE TRANSACTION 'x'", "PREPARE TRANSACTION", false},
	{"prepare /* c */ transaction 'x'", "PREPARE TRANSACTION", false},
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
	{"SET transaction_read_only = on", "SET TRANSACTION_READ_ONLY", false},
	{"set local transaction_isolation to 'serializable'", "SET TRANSACTION_ISOLATION", false},
	{"SET SESSION transaction_deferrable = true", "SET TRANSACTION_DEFERRABLE", false},
	{"SET default_transaction_read_only = on", "SET DEFAULT_TRANSACTION_READ_ONLY", false},
	{"SET default_transaction_isolation = 'serializable'", "", false},
	{"SET CONSTRAINTS ALL IMMEDIATE", "", true},
	{"set /* c */ constraints all immediate", "", true},
	{"INSERT INTO t VALUES (1); COMMIT", "", false}, // two statements: the server refuses the text
	{"ROLLBACK; INSERT INTO t VALUES (1)", "ROLLBACK", false},

	{"SELECT 'COMMIT'", "", false},
	{`"commit"`, "", false},
	{"SELECT end_date, commit_id FROM t", "", false},
	{"(SELECT 1)", "", false},
	{"WITH begin AS (SELECT 1) SELECT * FROM begin", "", false},
	{"DO $$ BEGIN COMMIT; END $$", "", false}, // the server refuses a COMMIT inside a transaction block
	{"CALL p()", "", false},
	{"SET LOCAL statement_timeout = '1s'", "", false},
	{"SET search_path = public", "", false},
	{"SET LOCAL ROLE tenant", "", false},
	{"PREPARE p AS SELECT 1", "", false},
	{"", "", false},
	{"/* unterminated COMMIT", "", false},
	// A byte that may start a character in the session's encoding starts a
	// word that is no keyword, to the guard and to the server alike.
	{"\x95COMMIT", "", false},
	{"E'\x95\\' ; COMMIT", "", false},
	{"\xd8;COMMIT", "", false},
}

func TestTheLeadingWordsDecide(t *testing.T) {
	t.Parallel()
	for _, tc := range kindCases {
		t.Run(tc.sql, func(t *testing.T) {
			k := kindOf(tc.sql)
			require.Equal(t, tc.control, k.control, "the statement that controls the transaction")
			require.Equal(t, tc.constraints, k.constraints, "SET CONSTRAINTS")
			if tc.control != "" {
				require.ErrorIs(t, Refuses(tc.sql), ErrTxControlled)
			} else {
				require.NoError(t, Refuses(tc.sql))
			}
		})
	}
}
