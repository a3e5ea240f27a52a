package consumertest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// notesBatch is a one-round-trip BatchHandler: one queued INSERT per batch.
// It fails a batch that holds a message whose value is fail, with fail's
// error, and records the ids of each call.
type notesBatch struct {
	table string
	fail  map[string]error

	mu    sync.Mutex
	calls [][]string
}

func (h *notesBatch) HandleBatch(_ context.Context, b *consumer.Batch) error {
	var ids, bodies []string
	for _, m := range b.Messages {
		if err := h.fail[string(m.Value)]; err != nil {
			return err
		}
		ids, bodies = append(ids, m.ID), append(bodies, string(m.Value))
	}
	h.mu.Lock()
	h.calls = append(h.calls, ids)
	h.mu.Unlock()
	b.Queue(`INSERT INTO `+h.table+` SELECT * FROM unnest($1::text[], $2::text[])`, ids, bodies)
	return nil
}

func notes(t *testing.T) (*testenv.DB, *notesBatch) {
	db := testenv.NewEmptyDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("notes")+` (id text PRIMARY KEY, body text NOT NULL)`)
	return db, &notesBatch{table: db.Table("notes")}
}

func fates(r consumertest.BatchResult) []consumertest.Fate {
	var out []consumertest.Fate
	for _, o := range r.Outcomes {
		out = append(out, o.Fate)
	}
	return out
}

// HandleBatch runs a BatchHandler through a real consumer: its claims make
// a second delivery a skip, and a failing message is set aside as the
// consumer sets it aside, its neighbours applied.
func TestHandleBatch(t *testing.T) {
	t.Parallel()

	t.Run("applies once, and a second delivery is skipped", func(t *testing.T) {
		t.Parallel()
		db, h := notes(t)
		cfg := consumer.Config{Name: "notes", Schema: db.Schema, BatchHandler: h}
		msgs := []*consumer.Message{
			consumertest.NewMessage([]byte("a"), consumertest.WithID("n-1")),
			consumertest.NewMessage([]byte("b"), consumertest.WithID("n-2")),
			consumertest.NewMessage([]byte("c"), consumertest.WithID("n-3")),
		}

		first := consumertest.HandleBatch(t, db.Pool, &cfg, msgs)
		require.Equal(t, []consumertest.Fate{consumertest.Applied, consumertest.Applied, consumertest.Applied}, fates(first), "%v", first.Outcomes)
		require.Equal(t, 3, first.Applied)
		require.Equal(t, [][]string{{"n-1", "n-2", "n-3"}}, h.calls, "one call for the fetched batch")
		require.EqualValues(t, 3, db.Int(t, `SELECT count(*) FROM `+db.Table("notes")))
		require.Equal(t, "n-2", first.Outcomes[1].Message.ID)
		require.EqualValues(t, 1, first.Outcomes[1].Message.Offset, "where Kafka put it")

		again := consumertest.HandleBatch(t, db.Pool, &cfg, msgs)
		require.Equal(t, first.Consumer, again.Consumer, "one consumer per test: the claims are shared")
		require.Equal(t, 3, again.Skipped, "%v", again.Outcomes)
		for _, o := range again.Outcomes {
			require.Equal(t, consumer.SkipReason("already_claimed"), o.SkipReason, "%v", o)
		}
		// The handler may have seen them again, in a one-round-trip attempt
		// that the claims then dropped with its queued statements (see
		// consumer.BatchHandler): what counts is that nothing was applied.
		require.EqualValues(t, 3, db.Int(t, `SELECT count(*) FROM `+db.Table("notes")), "applied once")
		require.Equal(t, "notes", cfg.Name, "the caller's Config is left as it was")
	})

	t.Run("a failing message is set aside and its neighbours applied", func(t *testing.T) {
		t.Parallel()
		db, h := notes(t)
		h.fail = map[string]error{"poison": consumer.Permanent(errors.New("cannot decode the note"))}
		cfg := consumer.Config{Name: "notes", Schema: db.Schema, BatchHandler: h}
		r := consumertest.HandleBatch(t, db.Pool, &cfg, []*consumer.Message{
			consumertest.NewMessage([]byte("a"), consumertest.WithID("n-1")),
			consumertest.NewMessage([]byte("poison"), consumertest.WithID("n-2")),
			consumertest.NewMessage([]byte("c"), consumertest.WithID("n-3")),
		})
		require.Equal(t, []consumertest.Fate{consumertest.Applied, consumertest.DeadLettered, consumertest.Applied}, fates(r), "%v", r.Outcomes)
		poison := r.Outcomes[1]
		require.Equal(t, deadletter.ClassPermanent, poison.DeadLetter.Class)
		require.ErrorContains(t, poison.DeadLetter.Err, "cannot decode the note")
		require.Len(t, poison.Failures, 1, "set aside at its first failure")
		require.True(t, poison.Failures[0].Permanent)
		require.Empty(t, r.Outcomes[0].Failures, "the batch's failure is not the neighbours'")
		require.Contains(t, h.calls, []string{"n-1"}, "after the batch failed, one message per call")
		require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")+` WHERE consumer = $1`, r.Consumer))
		require.EqualValues(t, 2, db.Int(t, `SELECT count(*) FROM `+db.Table("notes")))
	})

	t.Run("a transient failure is retried, then set aside", func(t *testing.T) {
		t.Parallel()
		db, h := notes(t)
		h.fail = map[string]error{"flaky": errors.New("partner timed out")}
		cfg := consumer.Config{Name: "notes", Schema: db.Schema, BatchHandler: h,
			Retry: consumer.RetryPolicy{MaxAttempts: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}}
		r := consumertest.HandleBatch(t, db.Pool, &cfg, []*consumer.Message{
			consumertest.NewMessage([]byte("flaky"), consumertest.WithID("n-1")),
			consumertest.NewMessage([]byte("b"), consumertest.WithID("n-2")),
		})
		require.Equal(t, []consumertest.Fate{consumertest.DeadLettered, consumertest.Applied}, fates(r), "%v", r.Outcomes)
		flaky := r.Outcomes[0]
		require.Equal(t, deadletter.ClassRetriesExhausted, flaky.DeadLetter.Class)
		require.Len(t, flaky.Failures, 2)
		require.False(t, slices.ContainsFunc(flaky.Failures, func(f consumer.Failure) bool { return f.Permanent }), "retried: not permanent")
	})
}
