package pipetx_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/pipetx"
)

// A Tx over a block opened by the caller behaves as pgx's own: statements,
// savepoints that roll back and release, COPY and large objects, all in the
// one transaction that the caller commits.
func TestTxInsideACallerOpenedBlock(t *testing.T) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		t.Skip("DATABASE_URL not set")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	must(t, err)
	defer conn.Close(ctx)
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue("CREATE TEMP TABLE pipetx_t (n int) ON COMMIT DROP")
	must(t, conn.SendBatch(ctx, &b).Close())
	tx := pipetx.New(conn)

	_, err = tx.Exec(ctx, "INSERT INTO pipetx_t VALUES (1)")
	must(t, err)
	sp, err := tx.Begin(ctx)
	must(t, err)
	_, err = sp.Exec(ctx, "INSERT INTO pipetx_t VALUES (2)")
	must(t, err)
	must(t, sp.Rollback(ctx)) // 2 is gone
	if err := sp.Commit(ctx); err != pgx.ErrTxClosed {
		t.Fatalf("commit after rollback: %v, want ErrTxClosed", err)
	}
	sp, err = tx.Begin(ctx)
	must(t, err)
	inner, err := sp.Begin(ctx)
	must(t, err)
	_, err = inner.Exec(ctx, "INSERT INTO pipetx_t VALUES (3)")
	must(t, err)
	must(t, inner.Commit(ctx))
	must(t, sp.Commit(ctx)) // 3 stays
	_, err = tx.CopyFrom(ctx, pgx.Identifier{"pipetx_t"}, []string{"n"}, pgx.CopyFromRows([][]any{{4}, {5}}))
	must(t, err)
	lo := tx.LargeObjects()
	oid, err := lo.Create(ctx, 0)
	must(t, err)
	must(t, lo.Unlink(ctx, oid))

	var sum int
	must(t, tx.QueryRow(ctx, "SELECT sum(n) FROM pipetx_t").Scan(&sum))
	if sum != 1+3+4+5 {
		t.Fatalf("sum %d, want 13", sum)
	}
	if s := conn.PgConn().TxStatus(); s != 'T' {
		t.Fatalf("transaction status %q, want still in the block", s)
	}
	must(t, tx.Commit(ctx))
	if s := conn.PgConn().TxStatus(); s != 'I' {
		t.Fatalf("transaction status %q after commit, want idle", s)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
