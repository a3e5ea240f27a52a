package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// What the server or the driver refuses because of what a handler wrote is
// that message's failure, found and set aside like any other: not retried
// as infrastructure for ever, and never taken for an unknown COMMIT
// outcome. The messages around it are applied once.

// A deferred constraint is checked at COMMIT, after every handler of the
// batch returned: the consumer cannot tell which message broke it until it
// applies them one per transaction.
func TestADeferredConstraintBrokenAtCommitSetsAsideItsMessage(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		refs := e.db.Table("refs")
		e.db.Exec(t, `CREATE TABLE `+refs+` (ref text, CONSTRAINT refs_unique UNIQUE (ref) DEFERRABLE INITIALLY DEFERRED)`)
		ids := e.produceIDs("d", 6)
		insertRef := `INSERT INTO ` + refs + ` (ref) VALUES ($1)`
		// d-3 reuses d-1's reference: the deferred unique constraint
		// fails at COMMIT.
		ref := func(m *consumer.Message) string {
			if m.ID == "d-3" {
				return "ref-d-1"
			}
			return "ref-" + m.ID
		}
		failed := &batchErrors{}
		var cfg *consumer.Config
		if batched {
			cfg = batchConfig(e, &batchEffects{e: e, extra: func(b *consumer.Batch) {
				for _, m := range b.Messages {
					b.Queue(insertRef, ref(m))
				}
			}})
		} else {
			cfg = e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if _, err := tx.Exec(ctx, insertRef, ref(m)); err != nil {
					return err
				}
				return e.applyHandler().Handle(ctx, tx, m)
			}))
		}
		cfg.Hooks = append(cfg.Hooks, failed)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 6}, 30*time.Second)
		r.stop()

		l := e.letters()["d-3"]
		require.Equal(t, deadletter.ClassData, l.Class, "a unique violation is data the database will always refuse")
		require.Contains(t, l.Error, "refs_unique")
		require.Zero(t, failed.containing("outcome unknown"))
		require.LessOrEqual(t, len(failed.errs), 4, "failed transactions: %v", failed.errs)
		e.check(expectation{ids: ids, poison: []string{"d-3"}})
	})
}

// A queued argument pgx cannot encode never reaches the server: nothing
// was sent, so the outcome is known. The message that queued it fails
// (retried, then set aside), and the rest of its batch is applied.
func TestAQueuedArgumentThatCannotBeEncodedFailsItsMessage(t *testing.T) {
	t.Parallel()
	bothWays(t, batchPaths, func(t *testing.T, claimFirst bool) {
		e := setup(t, 1)
		ids := e.produceIDs("u", 6)
		failed := &batchErrors{}
		cfg := batchConfig(e, &batchEffects{e: e, extra: func(b *consumer.Batch) {
			for _, m := range b.Messages {
				if m.ID == "u-2" {
					b.Queue(`SELECT $1::int`, make(chan int)) // no encoding for a channel
				}
			}
		}})
		cfg.ClaimFirst = claimFirst
		cfg.Retry.MaxAttempts = 2
		cfg.Hooks = append(cfg.Hooks, failed)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 6}, 30*time.Second)
		r.stop()

		l := e.letters()["u-2"]
		require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
		require.Contains(t, l.Error, "chan int")
		require.Zero(t, failed.containing("outcome unknown"))
		e.check(expectation{ids: ids, poison: []string{"u-2"}})
	})
}

// A queued statement the server refuses to prepare (a table a deploy has
// not created yet) is refused before the batch is sent: pgx prepares the
// batch's new statements in a round trip of their own, before BEGIN's
// pipeline in a one-trip batch and inside the open transaction when
// claiming first (where the refusal aborts it). Either way nothing
// committed and the outcome is known: the message that queued the
// statement fails, counted (a deploy may fix it), and is set aside once
// its attempts ran out; the rest of its batch is applied once.
func TestAQueuedStatementTheServerCannotPrepareFailsItsMessage(t *testing.T) {
	t.Parallel()
	bothWays(t, batchPaths, func(t *testing.T, claimFirst bool) {
		e := setup(t, 1)
		missing := e.db.Table("not_deployed_yet")
		failed := &batchErrors{}
		cfg := batchConfig(e, &batchEffects{e: e, extra: func(b *consumer.Batch) {
			for _, m := range b.Messages {
				if m.ID == "u-2" {
					b.Queue(`INSERT INTO `+missing+` (id) VALUES ($1)`, m.ID)
				}
			}
		}})
		cfg.ClaimFirst = claimFirst
		cfg.Retry.MaxAttempts = 2
		cfg.Hooks = append(cfg.Hooks, failed)
		ids := e.produceIDs("w", 1)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
		ids = append(ids, e.produceIDs("u", 6)...)
		e.waitCommitted(map[int]int64{0: 7}, 60*time.Second)
		r.stop()

		l := e.letters()["u-2"]
		require.Equal(t, deadletter.ClassRetriesExhausted, l.Class, "u-2's letter: %s", l.Error)
		require.Contains(t, l.Error, "not_deployed_yet")
		require.Zero(t, failed.containing("outcome unknown"))
		require.Empty(t, e.events.snapshot().stopped)
		e.check(expectation{ids: ids, poison: []string{"u-2"}})
	})
}
