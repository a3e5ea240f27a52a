package faultproxy_test

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// proxied starts a database of the test's own, a proxy in front of it, a
// pool of one connection through the proxy, and a table to write to.
func proxied(t *testing.T) (*testenv.DB, *faultproxy.Proxy, *pgxpool.Pool, string) {
	t.Helper()
	db := testenv.NewDB(t)
	proxy, err := faultproxy.Start(db.ServerAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	table := db.Table("proxied")
	db.Exec(t, `CREATE TABLE `+table+` (n int)`)
	return db, proxy, db.PoolVia(t, proxy.Addr(), testenv.MaxConns(1)), table
}

// Preparing a COMMIT (Parse, Describe, Sync: what pgx does the first time a
// connection meets a statement) runs nothing, so the proxy must not take
// it for the COMMIT whose reply it drops: the one it drops is the next one
// executed, which the server commits.
func TestDropAfterCommitsIgnoresACommitBeingPrepared(t *testing.T) {
	t.Parallel()
	db, proxy, pool, table := proxied(t)
	ctx := bounded(t)

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

// A swallowed COMMIT leaves the server session in its transaction, holding
// its locks, and SwallowedFrom names that session's client port.
func TestSwallowCommitsLeavesTheSessionInItsTransaction(t *testing.T) {
	t.Parallel()
	db, proxy, pool, table := proxied(t)
	ctx := bounded(t)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	proxy.SwallowCommits(1)
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("the client heard of a swallowed COMMIT")
	}
	if proxy.Swallowed() != 1 || proxy.SwallowedFrom() == 0 {
		t.Fatalf("Swallowed() = %d, SwallowedFrom() = %d after one swallowed COMMIT", proxy.Swallowed(), proxy.SwallowedFrom())
	}
	var state string
	var locks int64
	if err := db.Pool.QueryRow(ctx, `SELECT a.state, (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.granted AND l.relation = $2::regclass)
FROM pg_stat_activity a WHERE a.client_port = $1`, proxy.SwallowedFrom(), table).Scan(&state, &locks); err != nil {
		t.Fatalf("no session with client port %d: %v", proxy.SwallowedFrom(), err)
	}
	if state != "idle in transaction" || locks == 0 {
		t.Fatalf("the session left open is %q with %d locks on the table; want idle in transaction, holding them", state, locks)
	}
	if n := db.Int(t, `SELECT count(*) FROM `+table); n != 0 {
		t.Fatalf("a swallowed COMMIT committed: %d rows", n)
	}
}

// A stalled ROLLBACK never reaches the server and is never answered: the
// client waits until its own deadline, and the server's session stays in
// its transaction, as with a backend that stopped answering.
func TestStallRollbacksLeavesTheRollbackUnanswered(t *testing.T) {
	t.Parallel()
	db, proxy, pool, table := proxied(t)
	ctx := bounded(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	var pid int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	proxy.StallRollbacks(1)
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := tx.Rollback(rctx); err == nil {
		t.Fatal("a stalled ROLLBACK was answered")
	}
	if proxy.Stalled() != 1 {
		t.Fatalf("Stalled() = %d, want 1", proxy.Stalled())
	}
	if n := db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'idle in transaction'`, pid); n != 1 {
		t.Fatal("the server's session left its transaction: the ROLLBACK reached it")
	}
	// pgx would wait 15 s for the stalled server before letting go of the
	// connection.
	proxy.CutAll()
}

// Counted round trips are cut where asked: before, the server never sees
// the round trip (an INSERT sent in it is not there); after, the server
// ran it all (a COMMIT in it is durable) and the client hears nothing.
func TestCutAtRoundTripCutsBeforeOrAfterTheServerHasIt(t *testing.T) {
	t.Parallel()
	for _, after := range []bool{false, true} {
		db, proxy, pool, table := proxied(t)
		ctx := bounded(t)
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		proxy.CutAtRoundTrip(1, after)
		proxy.CountRoundTrips()
		// One simple-protocol text: one round trip.
		_, err = conn.Conn().PgConn().Exec(ctx, `BEGIN; INSERT INTO `+table+` VALUES (1); COMMIT`).ReadAll()
		if err == nil {
			t.Fatalf("after=%v: the cut round trip was answered", after)
		}
		conn.Release()
		if proxy.RoundTripsCut() != 1 || proxy.RoundTrips() != 1 {
			t.Fatalf("after=%v: %d round trips counted, %d cut; want 1 and 1", after, proxy.RoundTrips(), proxy.RoundTripsCut())
		}
		want := int64(0)
		if after {
			want = 1
		}
		if n := db.Int(t, `SELECT count(*) FROM `+table); n != want {
			t.Fatalf("after=%v: %d rows, want %d", after, n, want)
		}
	}
}

// bounded is the context of a test's calls through the proxy: one the
// proxy failed to cut or answer fails the test within half a minute,
// naming where it waited, instead of holding the package's run until its
// timeout.
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSilent(t *testing.T) {
	s, err := faultproxy.StartSilent()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var buf [1]byte
	if _, err := c.Read(buf[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read from a silent server: %v; want no answer", err)
	}
	s.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(buf[:]); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after Close: %v; want the connection closed", err)
	}
	if _, err := net.Dial("tcp", s.Addr()); err == nil {
		t.Fatal("a closed silent server still accepts")
	}
}
