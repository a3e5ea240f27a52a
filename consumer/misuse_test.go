package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// A handler can end the consumer's transaction without tx.Commit or
// tx.Rollback, which the guard refuses: with a COMMIT or ROLLBACK
// statement, sent through tx or queued. The consumer's statements after it
// would run outside the transaction; the position could move past
// messages whose claims were committed without their effects. What is
// durable can no longer be told, so the partition stops, and no offset is
// committed ahead of the stored position.
func TestAHandlerEndingItsTransactionWithAStatementStopsThePartition(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		stmt    string
		queued  bool
		perCall bool // a BatchHandler that opens its transaction first
	}{
		{name: "ROLLBACK through tx", stmt: "ROLLBACK"},
		{name: "COMMIT through tx", stmt: "COMMIT"},
		{name: "COMMIT and BEGIN through tx", stmt: "COMMIT; BEGIN"},
		{name: "ROLLBACK queued, one round trip", stmt: "ROLLBACK", queued: true},
		{name: "COMMIT queued, one round trip", stmt: "COMMIT", queued: true},
		{name: "COMMIT queued, ClaimFirst", stmt: "COMMIT", queued: true, perCall: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			first := e.produceIDs("w", 1)
			var cfg *consumer.Config
			if tc.queued {
				cfg = batchConfig(e, &batchEffects{e: e, extra: func(b *consumer.Batch) {
					for _, m := range b.Messages {
						if m.ID == "x-2" {
							b.Queue(tc.stmt)
						}
					}
				}})
				cfg.ClaimFirst = tc.perCall
			} else {
				apply := e.applyHandler()
				cfg = e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if err := apply.Handle(ctx, tx, m); err != nil {
						return err
					}
					if m.ID == "x-2" {
						_, err := tx.Exec(ctx, tc.stmt)
						return err
					}
					return nil
				}))
			}
			r := e.start(cfg)
			// A first batch stores a position, so the next may go in one
			// round trip.
			e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
			e.produceIDs("x", 5)
			waitFor(t, 30*time.Second, "the partition to stop", func() bool { return e.events.stoppedWith(consumer.ErrTxEnded) })
			r.stop()

			stopped := e.events.snapshot().stopped
			require.Len(t, stopped, 1)
			require.ErrorIs(t, stopped[0], consumer.ErrTxControlledByConsumer)
			require.Contains(t, stopped[0].Error(), "offsets 1 to 5")
			require.Equal(t, map[int]int64{0: 1}, e.kafka.CommittedOffsets(t, e.group, e.topic, 1), "no offset committed past the batch")
			e.commits.mu.Lock()
			defer e.commits.mu.Unlock()
			require.Empty(t, e.commits.violations, "offsets committed ahead of the stored position")
			e.requireExactlyOnceAtLeast(first)
		})
	}
}

// requireExactlyOnceAtLeast asserts one effect row for each of ids (other
// effects may exist).
func (e *env) requireExactlyOnceAtLeast(ids []string) {
	e.t.Helper()
	for _, id := range ids {
		require.EqualValuesf(e.t, 1, e.db.Int(e.t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id = $1`, id), "effects of message %s", id)
	}
}

// A handler that returns with a query's rows still open leaves the
// connection busy: pgx refuses every later statement before sending it.
// That is the handler's bug, found when its call returns: the message is
// set aside (nothing was sent, so no COMMIT outcome is unknown), and the
// rest of the batch is applied.
func TestAHandlerLeavingRowsOpenIsSetAside(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("q", 5)
	failed := &batchErrors{}
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := apply.Handle(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "q-3" {
			rows, err := tx.Query(ctx, `SELECT generate_series(1, 3)`)
			if err != nil {
				return err
			}
			rows.Next() // the first row only; rows stays open
		}
		return nil
	})
	cfg := e.config(h)
	cfg.Hooks = append(cfg.Hooks, failed)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	r.stop()
	require.Zero(t, failed.containing("outcome unknown"))
	l := e.letters()["q-3"]
	require.Equal(t, deadletter.ClassTxMisuse, l.Class)
	require.Contains(t, l.Error, "rows still open")
	e.check(expectation{ids: ids, poison: []string{"q-3"}})
}

// tx.Conn() hands out the raw connection, which the guard cannot follow:
// what a goroutine the handler left behind does with it is outside the
// guarantee (docs/guarantee.md says so). The guarded tx itself refuses.
func TestTheGuardedTxRefusesAfterTheCall(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("c", 2)
	var kept pgx.Tx
	var once sync.Once
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		once.Do(func() { kept = tx })
		return apply.Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	e.waitCommitted(map[int]int64{0: 2}, 30*time.Second)
	r.stop()
	_, err := kept.Exec(context.Background(), `INSERT INTO `+e.db.Table("effects")+` VALUES ('c-0', 't', 0, 0, 'late')`)
	require.ErrorIs(t, err, consumer.ErrTxCallOver)
	require.Nil(t, kept.Conn())
	e.check(expectation{ids: ids})
}
