package faultproxy_test

import (
	"context"
	"testing"

	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// Preparing a COMMIT (Parse, Describe, Sync: what pgx does the first time a
// connection meets a statement) runs nothing, so the proxy must not take
// it for the COMMIT whose reply it drops: the one it drops is the next one
// executed, which the server commits.
func TestDropAfterCommitsIgnoresACommitBeingPrepared(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	proxy, err := faultproxy.Start(db.ServerAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	pool := db.PoolVia(t, proxy.Addr(), testenv.MaxConns(1))
	ctx := context.Background()
	table := db.Table("proxied")
	db.Exec(t, `CREATE TABLE `+table+` (n int)`)

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	proxy.DropAfterCommits(1)
	if _, err := conn.Conn().Prepare(ctx, "commit_stmt", "COMMIT"); err != nil {
		t.Fatalf("preparing COMMIT was taken for a COMMIT: %v", err)
	}
	if proxy.Dropped() != 0 {
		t.Fatal("the proxy cut the connection on a COMMIT being prepared")
	}
	if _, err := conn.Exec(ctx, `BEGIN; INSERT INTO `+table+` VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "commit_stmt"); err == nil {
		t.Fatal("the reply to the executed COMMIT was not dropped")
	}
	if proxy.Dropped() != 1 {
		t.Fatalf("dropped %d connections, want 1", proxy.Dropped())
	}
	if n := db.Int(t, `SELECT count(*) FROM `+table); n != 1 {
		t.Fatalf("the server did not commit the dropped COMMIT: %d rows", n)
	}
}
