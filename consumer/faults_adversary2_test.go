package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

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
