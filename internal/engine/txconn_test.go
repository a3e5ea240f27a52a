package engine

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/pipetx"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// commitWith's placing of a failure is what every decision about a failed
// batch reads (commitFailed, oneTripFailed), and the table tests feed it
// made-up errors. Here a real server and pgx make them: each way a closing
// round trip (after BEGIN's, claiming first) or a whole one-trip batch
// (BEGIN first) can fail, and where commitWith places it: the statement
// that failed, the COMMIT, nothing sent, or an unknown outcome, and
// whether anything committed, which the placing must never contradict.
//
// It is the engine's one test against a server, and runs only when
// DATABASE_URL names one (as in CI): the engine's other tests run on
// values alone.
func TestCommitWithPlacesEachFailureAsTheServerSawIt(t *testing.T) {
	t.Parallel()
	if os.Getenv("DATABASE_URL") == "" {
		t.Skip("needs DATABASE_URL: the server's own errors are placed against a real Postgres")
	}
	db := testenv.NewDB(t, testenv.MaxConns(8))
	rows, keys, fn := db.Table("rows"), db.Table("keys"), db.Table("terminate")
	ctx := context.Background()
	db.Exec(t, `CREATE TABLE `+rows+` (v text)`)
	db.Exec(t, `CREATE TABLE `+keys+` (k text, CONSTRAINT keys_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`)
	// A deferred check that ends its own session at COMMIT: a real FATAL.
	db.Exec(t, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.k = 'fatal' THEN
		PERFORM pg_terminate_backend(pg_backend_pid());
		PERFORM pg_sleep(10);
	END IF;
	RETURN NULL;
END $$`)
	db.Exec(t, `CREATE CONSTRAINT TRIGGER terminate AFTER INSERT ON `+keys+` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
	insert := `INSERT INTO ` + rows + ` (v) VALUES ($1)`
	insertKey := `INSERT INTO ` + keys + ` (k) VALUES ($1)`

	type want struct {
		stmt      int  // where the failure is placed (commitError.stmt)
		committed bool // whether the row tagged with the case's name is there
		code      string
		pre       bool // pgx.ErrPreprocessingBatch in the chain
	}
	const commitAt = 3 // every closing batch below has three statements
	for _, tc := range []struct {
		name    string
		oneTrip bool
		// closing returns the three statements; tag is the row to look for.
		closing func(tag string) *pgx.Batch
		// before runs on the transaction's connection before the closing
		// round trip (claiming first only).
		before func(bt *batchTx)
		// drop drops the reply to the COMMIT.
		drop bool
		want want
	}{
		{name: "success", closing: func(tag string) *pgx.Batch {
			return queued([]any{insert, tag}, []any{`SELECT 1`}, []any{`SELECT 2`})
		}, want: want{stmt: 0, committed: true}},
		{name: "a statement fails", closing: func(tag string) *pgx.Batch {
			return queued([]any{insert, tag}, []any{`SELECT 1/0`}, []any{`SELECT 2`})
		}, want: want{stmt: 1, code: "22012"}},
		{name: "a deferred constraint at COMMIT", closing: func(tag string) *pgx.Batch {
			return queued([]any{insert, tag}, []any{insertKey, tag}, []any{insertKey, tag})
		}, want: want{stmt: commitAt, code: "23505"}},
		{name: "an argument pgx cannot encode", closing: func(tag string) *pgx.Batch {
			return queued([]any{insert, tag}, []any{`SELECT 1`}, []any{`SELECT $1::int`, make(chan int)})
		}, want: want{stmt: 2, pre: true}},
		{name: "a statement the server cannot prepare", closing: func(tag string) *pgx.Batch {
			return queued([]any{insert, tag}, []any{`INSERT INTO ` + db.Table("not_there") + ` VALUES ($1)`, tag}, []any{`SELECT 2`})
		}, want: want{stmt: 1, code: "42P01", pre: true}},
		{name: "the session ends at COMMIT", closing: func(tag string) *pgx.Batch {
			return queued([]any{insert, tag}, []any{insertKey, "fatal"}, []any{`SELECT 2`})
		}, want: want{stmt: commitAt, code: "57P01"}},
		{name: "the connection was closed before", closing: func(tag string) *pgx.Batch {
			return queued([]any{insert, tag}, []any{`SELECT 1`}, []any{`SELECT 2`})
		}, before: func(bt *batchTx) { _ = bt.tx.Conn().PgConn().Close(ctx) }, want: want{stmt: notSent}},
		{name: "the reply to COMMIT is lost", closing: func(tag string) *pgx.Batch {
			return queued([]any{insert, tag}, []any{`SELECT 1`}, []any{`SELECT 2`})
		}, drop: true, want: want{stmt: -1, committed: true}},
	} {
		for _, oneTrip := range []bool{false, true} {
			if oneTrip && tc.before != nil {
				continue
			}
			name := tc.name + "/claiming first"
			if oneTrip {
				name = tc.name + "/one trip"
			}
			t.Run(name, func(t *testing.T) {
				proxy, err := faultproxy.Start(db.ServerAddr(t))
				require.NoError(t, err)
				t.Cleanup(func() { proxy.Close() })
				pool := db.PoolVia(t, proxy.Addr(), func(c *pgxpool.Config) { c.MaxConns = 2 })
				conn, err := pool.Acquire(ctx)
				require.NoError(t, err)
				bt := &batchTx{tx: pipetx.New(conn.Conn()), pool: conn}
				tag := name
				b := tc.closing(tag)
				stmt := tc.want.stmt
				if oneTrip {
					full := &pgx.Batch{}
					queueBegin(full)
					full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
					b = full
					if stmt >= 0 {
						stmt++ // BEGIN comes first
					}
				} else {
					begin := &pgx.Batch{}
					queueBegin(begin)
					begin.Queue(`SELECT 1`)
					require.NoError(t, conn.SendBatch(ctx, begin).Close())
					if tc.before != nil {
						tc.before(bt)
					}
				}
				if tc.drop {
					proxy.DropAfterCommits(1)
				}
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				err = bt.commitWith(cctx, b)
				bt.rollback(cctx)

				if tc.want.committed && !tc.drop {
					require.NoError(t, err)
				} else {
					var ce *commitError
					require.ErrorAs(t, err, &ce, "a failed commit is a *commitError")
					require.Equal(t, stmt, ce.stmt, "placed at: %v", ce.err)
					if tc.want.code != "" {
						var pgErr *pgconn.PgError
						require.ErrorAs(t, err, &pgErr)
						require.Equal(t, tc.want.code, pgErr.Code)
					}
					var pre pgx.ErrPreprocessingBatch
					require.Equal(t, tc.want.pre, errors.As(err, &pre), "ErrPreprocessingBatch in %v", err)
				}
				n := db.Int(t, `SELECT count(*) FROM `+rows+` WHERE v = $1`, tag)
				require.Equal(t, tc.want.committed, n == 1, "the row committed")
				// Nothing is left holding a connection of the pool.
				require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 5*time.Second, 10*time.Millisecond)
			})
		}
	}
}

// queued is a batch of the statements given, each a query and its
// arguments.
func queued(statements ...[]any) *pgx.Batch {
	b := &pgx.Batch{}
	for _, st := range statements {
		b.Queue(st[0].(string), st[1:]...)
	}
	return b
}
