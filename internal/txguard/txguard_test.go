package txguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/notx"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// modes are the QueryExecModes a pool or a call may ask for.
var modes = map[string]pgx.QueryExecMode{
	"CacheStatement": pgx.QueryExecModeCacheStatement,
	"CacheDescribe":  pgx.QueryExecModeCacheDescribe,
	"DescribeExec":   pgx.QueryExecModeDescribeExec,
	"Exec":           pgx.QueryExecModeExec,
	"SimpleProtocol": pgx.QueryExecModeSimpleProtocol,
}

// sends are the ways a handler can send a text through its tx; args are
// the call's arguments, leading options included.
var sends = map[string]func(ctx context.Context, tx pgx.Tx, sql string, args ...any) error{
	"Exec": func(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
		_, err := tx.Exec(ctx, sql, args...)
		return err
	},
	"Query": func(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		rows.Close()
		return rows.Err()
	},
	"QueryRow": func(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
		err := tx.QueryRow(ctx, sql, args...).Scan()
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	},
	"SendBatch": func(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
		b := &pgx.Batch{}
		b.Queue("SELECT 1")
		b.Queue(sql, withoutMode(args)...)
		return tx.SendBatch(ctx, b).Close()
	},
	"Prepare": func(ctx context.Context, tx pgx.Tx, sql string, args ...any) error {
		if _, err := tx.Prepare(ctx, "handler_statement", sql); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "handler_statement", withoutMode(args)...)
		return err
	},
}

// withoutMode drops a leading QueryExecMode, which a batch would take for
// an argument.
func withoutMode(args []any) []any {
	if len(args) > 0 {
		if _, ok := args[0].(pgx.QueryExecMode); ok {
			return args[1:]
		}
	}
	return args
}

// setup is a table the tests' hidden statements write to, and a pool.
type setup struct {
	db    *testenv.DB
	table string
}

func newSetup(t *testing.T, opts ...testenv.DBOption) *setup {
	db := testenv.NewEmptyDB(t, opts...)
	s := &setup{db: db, table: db.Table("written")}
	db.Exec(t, `CREATE TABLE `+s.table+` (n int)`)
	return s
}

// guarded begins a transaction, rolled back when the test ends, and
// guards it.
func (s *setup) guarded(t *testing.T) (pgx.Tx, *Tx) {
	ctx := context.Background()
	tx, err := s.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	return tx, Wrap(tx)
}

// written counts the rows anything wrote, committed.
func (s *setup) written(t *testing.T) int64 { return s.db.Int(t, `SELECT count(*) FROM `+s.table) }

// Every text goes to the server as one Parse message, in every mode the
// pool or the call asks for and by every way of sending: a text of two
// statements is refused by the server, and neither runs.
func TestTheServerRefusesASecondStatement(t *testing.T) {
	t.Parallel()
	for poolMode, mode := range modes {
		t.Run("pool "+poolMode, func(t *testing.T) {
			t.Parallel()
			s := newSetup(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			for via, send := range sends {
				for callMode, cm := range modes {
					for _, withArg := range []bool{false, true} {
						name := fmt.Sprintf("%s, call %s, argument %v", via, callMode, withArg)
						t.Run(name, func(t *testing.T) {
							sql, args := `SELECT 1; INSERT INTO `+s.table+` VALUES (1)`, []any{cm}
							if withArg {
								sql, args = `SELECT $1::int; INSERT INTO `+s.table+` VALUES (1)`, []any{cm, 1}
							}
							requireTransactionKeptBy(t, s.db.Pool, sql, func(ctx context.Context, tx pgx.Tx) {
								err := send(ctx, Wrap(tx), sql, args...)
								var pgErr *pgconn.PgError
								require.ErrorAs(t, err, &pgErr, "the server's refusal")
								require.Equal(t, "42601", pgErr.Code, "%v", err)
								require.Contains(t, pgErr.Message, "multiple commands")
							})
						})
					}
				}
			}
			require.Zero(t, s.written(t), "a second statement ran")
		})
	}
}

// One text sent through the guard (with no arguments, the way pgx would
// send it in the simple protocol) runs in the transaction it was sent in
// and leaves it there, whatever the session's client encoding makes of
// its bytes: here a character whose second byte is a backslash or a
// quote, which the server reads as part of the character and a reader of
// bytes as an escape, with a ROLLBACK and an INSERT behind it.
func TestNoClientEncodingHidesAStatement(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	encodings := clientEncodings(t, s.db.Pool)
	require.Contains(t, encodings, "SJIS")
	for _, enc := range encodings {
		t.Run(enc, func(t *testing.T) {
			t.Parallel()
			for lead := 0x80; lead <= 0xff; lead++ {
				for _, trail := range []byte{'\\', '\'', ';'} {
					char := string([]byte{byte(lead), trail})
					for _, sql := range []string{
						`SELECT E'` + char + `' AS memo; ROLLBACK; INSERT INTO ` + s.table + ` VALUES (1); SELECT 1`,
						`SELECT '` + char + `' AS memo; ROLLBACK; INSERT INTO ` + s.table + ` VALUES (1); SELECT 1`,
						char + `ROLLBACK; INSERT INTO ` + s.table + ` VALUES (1)`,
					} {
						requireTransactionKeptBy(t, s.db.Pool, sql, func(ctx context.Context, tx pgx.Tx) {
							g := Wrap(tx)
							_, err := g.Exec(ctx, `SELECT set_config('client_encoding', $1, true)`, enc)
							require.NoError(t, err)
							_, err = g.Exec(ctx, sql)
							require.Error(t, err, "%q in %s", sql, enc)
						})
					}
				}
			}
		})
	}
	require.Zero(t, s.written(t), "a statement hidden by the encoding ran")
}

// clientEncodings are the encodings the server accepts as a client's.
func clientEncodings(t *testing.T, pool *pgxpool.Pool) []string {
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT DISTINCT pg_encoding_to_char(i) FROM generate_series(0, 64) i WHERE pg_encoding_to_char(i) <> ''`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	var accepted []string
	for _, name := range names {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT set_config('client_encoding', $1, true)`, name)
			return err
		})
		if err == nil {
			accepted = append(accepted, name)
		}
	}
	return accepted
}

// FuzzOneStatement sends random bytes through the guard, with no
// arguments, in a random client encoding: whatever it sends runs in the
// transaction it was sent in and leaves it open (or failed inside it).
func FuzzOneStatement(f *testing.F) {
	for _, tc := range kindCases {
		f.Add(tc.sql, uint8(0))
	}
	f.Add("SELECT E'\x95\\'; ROLLBACK; SELECT 1", uint8(3))
	f.Add(";;COMMIT", uint8(1))
	db := testenv.NewEmptyDB(f)
	encodings := []string{"UTF8", "SJIS", "BIG5", "GBK", "UHC", "GB18030", "JOHAB", "LATIN1", "EUC_JP", "SQL_ASCII"}
	f.Fuzz(func(t *testing.T, sql string, encoding uint8) {
		if strings.IndexByte(sql, 0) >= 0 {
			return // pgx refuses to send a NUL
		}
		enc := encodings[int(encoding)%len(encodings)]
		requireTransactionKeptBy(t, db.Pool, sql, func(ctx context.Context, tx pgx.Tx) {
			g := Wrap(tx)
			if _, err := g.Exec(ctx, `SELECT set_config('client_encoding', $1, true)`, enc); err != nil {
				t.Fatal(err)
			}
			_, _ = g.Exec(ctx, sql)
		})
	})
}

// requireTransactionKeptBy runs send inside a transaction and requires
// that the transaction is still the one it was sent in, open or aborted.
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
	require.NotEqual(t, byte('I'), status, "%q ended the transaction", sql)
	if status == 'E' {
		return // failed inside it: the same transaction, aborted
	}
	var after string
	require.NoError(t, tx.QueryRow(ctx, "SELECT set_config('client_encoding', 'UTF8', true), pg_current_xact_id()::text").Scan(new(string), &after))
	require.Equal(t, before, after, "%q moved to another transaction", sql)
}

// The statements that control the transaction are refused before
// anything is sent, by every way of sending, and the call counts as a
// misuse.
func TestAStatementThatControlsTheTransactionIsNotSent(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	for via, send := range sends {
		for _, tc := range kindCases {
			if tc.control == "" {
				continue
			}
			t.Run(via+" "+tc.sql, func(t *testing.T) {
				requireTransactionKeptBy(t, s.db.Pool, tc.sql, func(ctx context.Context, tx pgx.Tx) {
					g := Wrap(tx)
					require.ErrorIs(t, send(ctx, g, tc.sql), ErrTxControlled)
					require.True(t, g.Misused())
					require.Equal(t, byte('T'), tx.Conn().PgConn().TxStatus(), "nothing was sent")
				})
			})
		}
	}
}

// Once sealed, the transaction and everything it gave out refuse: a
// savepoint, a large-object API and a large object opened with it. The
// bare connection is never given out.
func TestNothingFromTheTransactionWorksAfterTheCall(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	tx, g := s.guarded(t)
	require.Nil(t, g.Conn(), "the bare connection")

	require.True(t, boundLargeObjects, "pgx.LargeObjects is a transaction alone")
	lo := g.LargeObjects()
	oid, err := lo.Create(ctx, 0)
	require.NoError(t, err, "large objects work during the call")
	obj, err := lo.Open(ctx, oid, pgx.LargeObjectModeWrite|pgx.LargeObjectModeRead)
	require.NoError(t, err)
	_, err = obj.Write([]byte("during"))
	require.NoError(t, err)
	sp, err := g.Begin(ctx)
	require.NoError(t, err)

	g.Seal()
	_, err = lo.Create(ctx, 0)
	require.ErrorIs(t, err, ErrCallOver, "a kept LargeObjects")
	_, err = obj.Write([]byte("after"))
	require.ErrorIs(t, err, ErrCallOver, "a kept LargeObject")
	_, err = sp.Exec(ctx, `INSERT INTO `+s.table+` VALUES (1)`)
	require.ErrorIs(t, err, ErrCallOver, "a kept savepoint")
	_, err = g.Exec(ctx, `INSERT INTO `+s.table+` VALUES (1)`)
	require.ErrorIs(t, err, ErrCallOver)
	require.Equal(t, byte('T'), tx.Conn().PgConn().TxStatus())
}

// On a connection whose default mode is the simple protocol, pgx would
// send a batch as one text, its queries joined: the guard sends them one
// at a time instead. Queries that would run into each other once joined
// are each refused by the server alone; a batch of sound queries works,
// callbacks and all.
func TestABatchInTheSimpleProtocolGoesOneQueryAtATime(t *testing.T) {
	t.Parallel()
	s := newSetup(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
	t.Run("queries that join into statements", func(t *testing.T) {
		for name, queries := range map[string][]string{
			"dollar quotes": {"SELECT $$", "$$; COMMIT; INSERT INTO " + s.table + " VALUES (1); SELECT $$", "$$"},
			"plain quotes":  {"SELECT '", "'; COMMIT; INSERT INTO " + s.table + " VALUES (1); SELECT '", "'"},
			"a comment":     {"SELECT 1 /*", "*/ COMMIT; INSERT INTO " + s.table + " VALUES (1); /*", "*/"},
		} {
			t.Run(name, func(t *testing.T) {
				requireTransactionKeptBy(t, s.db.Pool, queries[1], func(ctx context.Context, tx pgx.Tx) {
					b := &pgx.Batch{}
					for _, q := range queries {
						b.Queue(q)
					}
					var pgErr *pgconn.PgError
					require.ErrorAs(t, Wrap(tx).SendBatch(ctx, b).Close(), &pgErr)
				})
			})
		}
		require.Zero(t, s.written(t))
	})
	t.Run("sound queries", func(t *testing.T) {
		requireTransactionKeptBy(t, s.db.Pool, "a batch", func(ctx context.Context, tx pgx.Tx) {
			b := &pgx.Batch{}
			var one, two int
			var tag pgconn.CommandTag
			b.Queue(`INSERT INTO `+s.table+` VALUES ($1)`, 7).Exec(func(ct pgconn.CommandTag) error { tag = ct; return nil })
			b.Queue(`SELECT $1::int`, 1).QueryRow(func(r pgx.Row) error { return r.Scan(&one) })
			b.Queue(`SELECT n + 1 FROM ` + s.table).Query(func(rows pgx.Rows) error {
				for rows.Next() {
					if err := rows.Scan(&two); err != nil {
						return err
					}
				}
				return rows.Err()
			})
			require.NoError(t, Wrap(tx).SendBatch(ctx, b).Close())
			require.Equal(t, "INSERT 0 1", tag.String())
			require.Equal(t, 1, one)
			require.Equal(t, 8, two)
		})
	})
	t.Run("results read after the call sends nothing", func(t *testing.T) {
		requireTransactionKeptBy(t, s.db.Pool, "a batch", func(ctx context.Context, tx pgx.Tx) {
			g := Wrap(tx)
			b := &pgx.Batch{}
			b.Queue(`SELECT 1`)
			b.Queue(`INSERT INTO ` + s.table + ` VALUES (1)`)
			br := g.SendBatch(ctx, b)
			_, err := br.Exec()
			require.NoError(t, err)
			g.Seal() // the call is over; a goroutine it left keeps br
			_, err = br.Exec()
			require.ErrorIs(t, err, ErrCallOver)
			require.ErrorIs(t, br.Close(), ErrCallOver)
		})
		require.Zero(t, s.written(t))
	})
	t.Run("a failed query fails the rest", func(t *testing.T) {
		requireTransactionKeptBy(t, s.db.Pool, "a batch", func(ctx context.Context, tx pgx.Tx) {
			b := &pgx.Batch{}
			b.Queue(`SELECT 1/0`)
			b.Queue(`INSERT INTO ` + s.table + ` VALUES (1)`)
			br := Wrap(tx).SendBatch(ctx, b)
			_, err := br.Exec()
			require.Error(t, err)
			_, err2 := br.Exec()
			require.Equal(t, err, err2)
			require.Equal(t, err, br.Close())
		})
	})
}

// pgx writes a COPY's text from the names it is given: the guard sends it
// only while the session's client encoding, as the server reports it, is
// UTF8.
func TestCopyFromOnlyInUTF8(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	ctx := context.Background()
	_, g := s.guarded(t)
	table := pgx.Identifier{s.db.Schema, "written"}
	n, err := g.CopyFrom(ctx, table, []string{"n"}, pgx.CopyFromRows([][]any{{1}, {2}}))
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	_, err = g.Exec(ctx, `SET LOCAL client_encoding = 'SJIS'`)
	require.NoError(t, err)
	_, err = g.CopyFrom(ctx, table, []string{"n"}, pgx.CopyFromRows([][]any{{3}}))
	require.ErrorContains(t, err, `client_encoding is "SJIS"`)
}

// A handler's transaction that is not open yet (a batch tried in one round
// trip) counts every use: the guard itself must use it for nothing, or the
// batch would be taken for one whose handler needs its transaction.
func TestTheGuardUsesNothingOfATransactionNotOpenYet(t *testing.T) {
	t.Parallel()
	ahead := &notx.Tx{}
	g := Wrap(ahead)
	_, _, err := Queued(g, `INSERT INTO t VALUES ($1)`, []any{1})
	require.NoError(t, err)
	_, _, err = Queued(g, `COMMIT`, nil)
	require.ErrorIs(t, err, ErrTxControlled)
	require.Equal(t, pgx.QueryExecModeCacheStatement, g.state.defaultMode())
	_ = g.LargeObjects()
	require.Nil(t, g.Conn())
	require.False(t, ahead.Used(), "the guard used the transaction")
	_, err = g.Exec(context.Background(), `SELECT 1`)
	require.ErrorIs(t, err, notx.ErrNotOpen)
	require.True(t, ahead.Used(), "the handler's own use counts")
}
