package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// Outbox rows queued from a BatchHandler commit with its batch, or not at
// all, and the relay delivers them as it delivers written ones.
func TestQueueFromABatchHandler(t *testing.T) {
	t.Parallel()

	// notify queues, per message, a note and an outbox row to the
	// "email" function; a note whose body is too long fails its queued
	// INSERT (a CHECK), so the batch fails at its COMMIT.
	notify := func(db *testenv.DB, box *outbox.Outbox) consumer.BatchHandlerFunc {
		return func(ctx context.Context, b *consumer.Batch) error {
			var ids, bodies []string
			var rows []outbox.Message
			for _, m := range b.Messages {
				ids, bodies = append(ids, m.ID), append(bodies, string(m.Value))
				rows = append(rows, outbox.Message{ID: "email:" + m.ID, Destination: "email", Key: m.Key, Value: m.Value})
			}
			if _, err := box.Queue(ctx, b, rows...); err != nil {
				return err
			}
			b.Queue(`INSERT INTO `+db.Table("notes")+` SELECT * FROM unnest($1::text[], $2::text[])`, ids, bodies)
			return nil
		}
	}
	setup := func(t *testing.T) (*testenv.DB, *outbox.Outbox) {
		db := testenv.NewDB(t)
		db.Exec(t, `CREATE TABLE `+db.Table("notes")+` (id text PRIMARY KEY, body text NOT NULL CHECK (length(body) < 10))`)
		box, err := outbox.New(db.Schema)
		require.NoError(t, err)
		return db, box
	}
	outboxIDs := func(t *testing.T, db *testenv.DB) []string {
		rows, err := db.Pool.Query(context.Background(), `SELECT id FROM `+db.Table("outbox")+` ORDER BY id`)
		require.NoError(t, err)
		var ids []string
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		return ids
	}

	t.Run("written in the batch's transaction and relayed", func(t *testing.T) {
		t.Parallel()
		db, box := setup(t)
		cfg := consumer.Config{Name: "notify", Schema: db.Schema, BatchHandler: notify(db, box)}
		r := consumertest.HandleBatch(t, db.Pool, &cfg, []*consumer.Message{
			consumertest.NewMessage([]byte("hi"), consumertest.WithID("m-1"), consumertest.WithKey([]byte("alice"))),
			consumertest.NewMessage([]byte("hello"), consumertest.WithID("m-2"), consumertest.WithKey([]byte("alice"))),
		})
		require.Equal(t, 2, r.Applied, "%v", r.Outcomes)
		require.Equal(t, []string{"email:m-1", "email:m-2"}, outboxIDs(t, db))

		var mu sync.Mutex
		var delivered []string
		runRelay(t, db, outbox.RelayConfig{Deliver: func(_ context.Context, d *outbox.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			delivered = append(delivered, d.ID+"="+string(d.Value))
			return nil
		}})
		waitFor(t, func() bool { return pending(t, db) == 0 }, "the queued rows delivered")
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, []string{"email:m-1=hi", "email:m-2=hello"}, delivered, "in the order they were queued, one key")
	})

	t.Run("rolled back with a batch that fails", func(t *testing.T) {
		t.Parallel()
		db, box := setup(t)
		cfg := consumer.Config{Name: "notify", Schema: db.Schema, BatchHandler: notify(db, box)}
		r := consumertest.HandleBatch(t, db.Pool, &cfg, []*consumer.Message{
			consumertest.NewMessage([]byte("hi"), consumertest.WithID("m-1")),
			consumertest.NewMessage([]byte("far too long a note"), consumertest.WithID("m-2")),
			consumertest.NewMessage([]byte("bye"), consumertest.WithID("m-3")),
		})
		require.Equal(t, 2, r.Applied, "%v", r.Outcomes)
		require.Equal(t, consumertest.DeadLettered, r.Outcomes[1].Fate)
		require.Equal(t, deadletter.ClassData, r.Outcomes[1].DeadLetter.Class, "a CHECK violation: %v", r.Outcomes[1])
		require.Equal(t, []string{"email:m-1", "email:m-3"}, outboxIDs(t, db),
			"the failed batch's rows were rolled back with it, and the failing message's with its own attempt")
	})
}

// Queue needs a batch, and returns the ids at once, with one statement
// queued for all the rows.
func TestQueueHandsTheBatchOneStatement(t *testing.T) {
	t.Parallel()
	box, err := outbox.New("kafkaonce")
	require.NoError(t, err)
	ok := outbox.Message{ID: "ok-1", Destination: "email"}

	_, err = box.Queue(context.Background(), nil, ok)
	require.ErrorContains(t, err, "Queue needs the Batch the BatchHandler was given")

	var sqls []string
	b := consumer.NewBatch(nil, nil, func(sql string, _ ...any) { sqls = append(sqls, sql) })
	ids, err := box.Queue(context.Background(), b, ok, outbox.Message{Destination: "email"})
	require.NoError(t, err)
	require.Equal(t, "ok-1", ids[0])
	require.Len(t, ids[1], 36, "a new UUID")
	require.Len(t, sqls, 1, "one statement for the rows")
}
