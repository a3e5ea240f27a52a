package consumer_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
)

// docs/failures.md: "a message's transaction whose connection broke [is a
// failure] of the database, not of the message: the whole transaction
// runs again after a backoff, without limit and without counting an
// attempt, so an outage never dead-letters good messages."
//
// The engine decides by the error's type, not by the connection: with the
// transaction's connection broken (the network to Postgres cut, or the
// server ending the session), a handler that returns nil is retried
// uncounted (ErrTxAborted-like: nothing can commit), one that returns the
// error wrapped with %w too, but one that reports the failure in its own
// words (fmt.Errorf with %v, a domain error, errors.New(err.Error()) — as
// a great deal of code does) is counted, and after MaxAttempts the good
// message is set aside as retries_exhausted because the database failed.
// The connection is closed either way (the attempt sees it: connLost);
// nothing the handler did can commit on it.
func TestAdversary2ABrokenTransactionIsTheDatabasesWhateverTheHandlerSays(t *testing.T) {
	t.Parallel()
	const (
		victim      = "v-2"
		maxAttempts = 3
		breaks      = 2 * maxAttempts
	)
	for _, tc := range []struct {
		name      string
		terminate bool // the server ends the session (FATAL 57P01) instead of the network failing
	}{
		{name: "network cut"},
		{name: "session terminated", terminate: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			proxy, err := faultproxy.Start(e.db.ServerAddr(t))
			require.NoError(t, err)
			t.Cleanup(func() { proxy.Close() })
			ids := e.produceIDs("v", 5)

			var calls atomic.Int32
			apply := e.applyHandler()
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == victim && calls.Add(1) <= breaks {
					if tc.terminate {
						var pid int32
						if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
							return err
						}
						if _, err := e.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
							return err
						}
						for e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) != 0 {
							time.Sleep(10 * time.Millisecond)
						}
					} else {
						proxy.CutAll()
					}
					if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
						// The handler's own words, the cause as text.
						return fmt.Errorf("could not record the order: %v", err)
					}
					return fmt.Errorf("a query went through a broken connection")
				}
				return apply.Handle(ctx, tx, m)
			})
			cfg := e.config(h)
			cfg.Retry.MaxAttempts = maxAttempts
			r := e.start(cfg, e.db.PoolVia(t, proxy.Addr()))
			e.waitCommitted(map[int]int64{0: 5}, 60*time.Second)
			r.stop()
			if l, ok := e.letters()[victim]; ok {
				t.Fatalf("good message %s set aside (class %s, %d attempts) because its transaction's connection broke %d times: %s",
					victim, l.Class, l.Attempts, breaks, l.Error)
			}
			require.Greater(t, calls.Load(), int32(breaks))
			e.check(expectation{ids: ids})
		})
	}
}

// docs/guarantee.md, "Contention is never a message's failure": a lock wait
// rolls back and runs again "without counting an attempt and without
// setting anything aside"; docs/failures.md: "A row that another session
// keeps locked blocks the messages that need it for as long as it stays
// locked, as an outage would, and never sets them aside".
//
// New accepts a HandlerTimeout shorter than LockTimeout (it refuses only
// an IdleInTransactionTimeout that is not longer). A handler waiting on a
// row lock then meets HandlerTimeout before lock_timeout: the wait ends as
// ErrTimeout, an attempt of the message's, and after MaxAttempts the
// message is set aside as retries_exhausted because another session held a
// row for a few seconds.
func TestAdversary2ALockWaitCutByHandlerTimeoutSetsTheMessageAside(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := context.Background()
	e.db.Exec(t, `CREATE TABLE `+e.db.Table("hot")+` (id int PRIMARY KEY, n int NOT NULL)`)
	e.db.Exec(t, `INSERT INTO `+e.db.Table("hot")+` VALUES (1, 0)`)
	hold, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `UPDATE `+e.db.Table("hot")+` SET n = n WHERE id = 1`)
	require.NoError(t, err)

	ids := e.produceIDs("h", 3)
	apply := e.applyHandler()
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if _, err := tx.Exec(ctx, `UPDATE `+e.db.Table("hot")+` SET n = n + 1 WHERE id = 1`); err != nil {
			return err
		}
		return apply.Handle(ctx, tx, m)
	}))
	cfg.HandlerTimeout = time.Second // LockTimeout stays at its default, 10s
	cfg.Retry.MaxAttempts = 2
	r := e.start(cfg)
	time.Sleep(8 * time.Second) // the row is held for 8s, less than LockTimeout
	require.NoError(t, hold.Rollback(ctx))
	e.waitCommitted(map[int]int64{0: 3}, 60*time.Second)
	r.stop()
	if ls := e.letters(); len(ls) > 0 {
		for id, l := range ls {
			t.Errorf("message %s set aside (class %s, %d attempts) while another session held a row it needs: %s", id, l.Class, l.Attempts, l.Error)
		}
		t.FailNow()
	}
	e.check(expectation{ids: ids})
}
