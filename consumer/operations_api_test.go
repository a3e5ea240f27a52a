package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/store/letters"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

type partnerError struct{ code int }

func (e *partnerError) Error() string { return "partner said no" }

// consumertest.Handle calls the handler through the engine
// (engine.HandleAlone): the handler must get the message as built, every
// field of it; its own error back unchanged
// (errors.As finds its type); a tx that refuses use once the call is over;
// and its writes undone when it fails.
func TestConsumertestHandleGoesThroughTheEngine(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	notes := db.Table("notes")
	db.Exec(t, `CREATE TABLE `+notes+` (id text PRIMARY KEY)`)
	ctx := context.Background()
	at := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	m := consumertest.NewMessage([]byte("value"), consumertest.WithID("id-1"), consumertest.WithKey([]byte("key")),
		consumertest.WithHeader("trace", []byte("t-1")), consumertest.WithPosition("orders", 3, 42))
	m.Time = at

	tx := consumertest.Tx(t, db.Pool)
	var got *consumer.Message
	var gotCopy seenMsg
	var kept pgx.Tx
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		got, gotCopy, kept = msg, copyMsg(msg), tx
		_, err := tx.Exec(ctx, `INSERT INTO `+notes+` VALUES ($1)`, msg.ID)
		return err
	})
	require.NoError(t, consumertest.Handle(ctx, t, tx, h, m))
	require.Same(t, m, got, "the handler gets the caller's message")
	require.Equal(t, seenMsg{ID: "id-1", Topic: "orders", Partition: 3, Offset: 42, Key: []byte("key"), Value: []byte("value"),
		Headers: []consumer.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte("id-1")}, {Key: "trace", Value: []byte("t-1")}}, Time: at}, gotCopy)
	_, err := kept.Exec(ctx, `INSERT INTO `+notes+` VALUES ('late')`)
	require.ErrorIs(t, err, consumer.ErrTxCallOver, "the tx refuses use after the call")
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+notes).Scan(&n))
	require.Equal(t, 1, n)

	failing := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+notes+` VALUES ('undone')`); err != nil {
			return err
		}
		return &partnerError{code: 7}
	})
	err = consumertest.Handle(ctx, t, tx, failing, m)
	var pe *partnerError
	require.True(t, errors.As(err, &pe), "%T %v", err, err)
	require.Equal(t, 7, pe.code)
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM `+notes+` WHERE id = 'undone'`).Scan(&n))
	require.Zero(t, n, "a failed handler's writes are undone")

	rolls := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
		return tx.Rollback(ctx)
	})
	err = consumertest.Handle(ctx, t, tx, rolls, m)
	require.ErrorIs(t, err, consumer.ErrTxControlledByConsumer)
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err, "the test's transaction is still usable")
}

// The engine's redrive locks a letter with GetForUpdate, now in two round
// trips (lock, then read): a redrive waiting for another's lock must read
// the letter as the other left it (redriven), and one whose letter was
// deleted meanwhile, or that belongs to another consumer, gets ErrNotFound.
func TestGetForUpdateReadsTheLetterAsTheLockHolderLeftIt(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	s, err := letters.NewStore(db.Schema)
	require.NoError(t, err)
	b := &pgx.Batch{}
	now := time.Now()
	require.NoError(t, s.QueueInsert(b, "c1", "t", 0, []deadletter.Letter{
		{Offset: 1, MessageID: "m-1", Value: []byte("one"), Class: deadletter.ClassPermanent, Error: "e", Attempts: 1, FirstFailedAt: now, LastFailedAt: now},
		{Offset: 2, MessageID: "m-2", Value: []byte("two"), Class: deadletter.ClassPermanent, Error: "e", Attempts: 1, FirstFailedAt: now, LastFailedAt: now},
	}))
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	all, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c1"})
	require.NoError(t, err)
	require.Len(t, all, 2)
	id1, id2 := all[0].ID, all[1].ID

	// Another consumer's letter is not found.
	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := s.GetForUpdate(ctx, tx, "c2", id1)
		return err
	})
	require.ErrorIs(t, err, deadletter.ErrNotFound)

	// Holder locks letter 1 and marks it redriven; a second transaction
	// waits for the lock and must then see the mark.
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	l, err := s.GetForUpdate(ctx, holder, "c1", id1)
	require.NoError(t, err)
	require.Nil(t, l.RedrivenAt)
	require.Equal(t, "one", string(l.Value))
	require.NoError(t, s.MarkRedriven(ctx, holder, id1))

	type result struct {
		l   deadletter.Letter
		err error
	}
	waiter := make(chan result, 1)
	go func() {
		var r result
		r.err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			r.l, err = s.GetForUpdate(ctx, tx, "c1", id1)
			return err
		})
		waiter <- r
	}()
	waitFor(t, 10*time.Second, "GetForUpdate waiting for the holder's lock", func() bool {
		select {
		case r := <-waiter:
			t.Fatalf("GetForUpdate did not wait for the lock: %+v", r)
		default:
		}
		return db.LockWaits(t, "dead_letters") > 0
	})
	require.NoError(t, holder.Commit(ctx))
	select {
	case r := <-waiter:
		require.NoError(t, r.err)
		require.NotNil(t, r.l.RedrivenAt, "the waiter reads the letter as the holder committed it")
		require.Equal(t, id1, r.l.ID)
	case <-time.After(10 * time.Second):
		t.Fatal("GetForUpdate still waiting after the holder committed")
	}

	// Letter 2 deleted while a redrive waits for its lock.
	deleter, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = deleter.Rollback(ctx) }()
	_, err = deleter.Exec(ctx, `DELETE FROM `+db.Table("dead_letters")+` WHERE id = $1`, id2)
	require.NoError(t, err)
	go func() {
		var r result
		r.err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			var err error
			r.l, err = s.GetForUpdate(ctx, tx, "c1", id2)
			return err
		})
		waiter <- r
	}()
	waitFor(t, 10*time.Second, "GetForUpdate waiting for the deleter's lock", func() bool { return db.LockWaits(t, "dead_letters") > 0 })
	require.NoError(t, deleter.Commit(ctx))
	select {
	case r := <-waiter:
		require.ErrorIs(t, r.err, deadletter.ErrNotFound)
	case <-time.After(10 * time.Second):
		t.Fatal("GetForUpdate still waiting after the delete committed")
	}
}

// offsets.Store.Forget deletes one consumer's positions of one topic, every
// partition, and nothing else; deadletter.Store.Footprints returns the
// offset and content fingerprint of one consumer's letters of one
// partition in an inclusive range.
func TestForgetAndFootprintsSelectExactlyTheirRows(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	ctx := context.Background()
	pos, err := offsets.NewStore(db.Schema)
	require.NoError(t, err)
	for _, r := range []struct {
		consumer, topic string
		partition       int
	}{{"a", "t", 0}, {"a", "t", 1}, {"a", "t", 2}, {"a", "u", 0}, {"b", "t", 0}, {"a", "t.x", 0}} {
		require.NoError(t, pos.Reset(ctx, db.Pool, r.consumer, r.topic, r.partition, 10))
	}
	n, err := pos.Forget(ctx, db.Pool, "a", "t")
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	n, err = pos.Forget(ctx, db.Pool, "a", "t")
	require.NoError(t, err)
	require.Zero(t, n)
	for _, r := range []struct {
		consumer, topic string
		partition       int
		want            bool
	}{{"a", "t", 0, false}, {"a", "t", 1, false}, {"a", "u", 0, true}, {"b", "t", 0, true}, {"a", "t.x", 0, true}} {
		_, ok, err := pos.Load(ctx, db.Pool, r.consumer, r.topic, r.partition)
		require.NoError(t, err)
		require.Equalf(t, r.want, ok, "%+v", r)
	}

	ls, err := letters.NewStore(db.Schema)
	require.NoError(t, err)
	now := time.Now()
	mk := func(off int64, key, value string) deadletter.Letter {
		return deadletter.Letter{Offset: off, MessageID: "m", Key: []byte(key), Value: []byte(value), Class: deadletter.ClassPermanent,
			Error: "e", Attempts: 1, FirstFailedAt: now, LastFailedAt: now}
	}
	b := &pgx.Batch{}
	require.NoError(t, ls.QueueInsert(b, "a", "t", 0, []deadletter.Letter{mk(4, "k4", "v4"), mk(5, "k5", "v5"), mk(9, "k9", "v9"), mk(10, "", "v10")}))
	require.NoError(t, ls.QueueInsert(b, "a", "t", 1, []deadletter.Letter{mk(5, "k5", "other")}))
	require.NoError(t, ls.QueueInsert(b, "b", "t", 0, []deadletter.Letter{mk(5, "k5", "b's")}))
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	fs, err := ls.Footprints(ctx, db.Pool, "a", "t", 0, 5, 10)
	require.NoError(t, err)
	got := map[int64]dedupe.Fingerprint{}
	for _, f := range fs {
		_, dup := got[f.Offset]
		require.False(t, dup)
		got[f.Offset] = f.Fingerprint
	}
	require.Equal(t, map[int64]dedupe.Fingerprint{
		5:  dedupe.FingerprintOf([]byte("k5"), []byte("v5")),
		9:  dedupe.FingerprintOf([]byte("k9"), []byte("v9")),
		10: dedupe.FingerprintOf(nil, []byte("v10")),
	}, got)
}
