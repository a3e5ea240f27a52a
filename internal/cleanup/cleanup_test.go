package cleanup_test

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/kafkaonce/kafkaonce/internal/cleanup"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A ROLLBACK the server does not answer ends within the bound, even on a
// context already cancelled (a shutdown's), and its connection is closed
// at once rather than left to pgx's wait for the server's goodbye.
func TestRollbackEndsWhenTheServerDoesNotAnswer(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	proxy, err := faultproxy.Start(db.ServerAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	pool := db.PoolVia(t, proxy.Addr(), testenv.MaxConns(1))
	tx, err := pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	proxy.StallRollbacks(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := cleanup.Rollback(ctx, tx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Rollback = %v, want the bound's deadline", err)
	}
	if proxy.Stalled() != 1 {
		t.Fatal("the ROLLBACK was not stalled")
	}
	if _, err := tx.Conn().PgConn().Conn().Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("reading the connection after the bound: %v, want it closed", err)
	}
}

// A ROLLBACK the server answers rolls back, on a cancelled context too.
func TestRollbackRollsBackOnACancelledContext(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	table := db.Table("rolled")
	db.Exec(t, `CREATE TABLE `+table+` (n int)`)
	tx, err := db.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(context.Background(), `INSERT INTO `+table+` VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := cleanup.Rollback(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if n := db.Int(t, `SELECT count(*) FROM `+table); n != 0 {
		t.Fatalf("%d rows kept", n)
	}
}
