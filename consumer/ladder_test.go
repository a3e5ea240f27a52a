package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

var errSentinel = errors.New("sentinel")

// Under StopPartition, the PartitionError a partition stops with is the
// engine's, aliased: errors.As must find in it the consumer's public
// *MessageError (a handler's failure, with the handler's own error still
// reachable by errors.Is) and *FingerprintConflictError (an id reused),
// and the conflict hook is told once.
func TestPartitionErrorsUnwrapToThePublicTypes(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	e.kafka.Produce(t, e.topic,
		msg(0, "a", "ok"), msg(0, "bad", "ok"), msg(0, "c", "ok"),
		msg(1, "x", "first"), msg(1, "x", "second"), msg(1, "z", "ok"))
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "bad" {
			return consumer.Permanent(fmt.Errorf("wrapped: %w", errSentinel))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.OnPermanentFailure = consumer.StopPartition
	tp := withTap(cfg)
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "both partitions stopped", func() bool { return len(tp.snap().stopped) == 2 })
	stillFor(t, 500*time.Millisecond, "a stopped partition went on", func() bool { return maps.Equal(map[int]int64{0: 1, 1: 1}, e.storedPositions()) })
	r.stop()

	e.requireExactlyOnce([]string{"a", "x"})
	require.Equal(t, map[int]int64{0: 1, 1: 1}, e.storedPositions())
	committed := e.kafka.CommittedOffsets(t, e.group, e.topic, 2)
	require.LessOrEqual(t, committed[0], int64(1))
	require.LessOrEqual(t, committed[1], int64(1))

	s := tp.snap()
	var p0, p1 *consumer.PartitionError
	for _, st := range s.stopped {
		if st.Partition == 0 {
			p0 = st
		} else {
			p1 = st
		}
	}
	require.NotNil(t, p0)
	require.NotNil(t, p1)

	var merr *consumer.MessageError
	require.True(t, errors.As(p0, &merr), "%v", p0)
	require.Equal(t, "bad", merr.MessageID)
	require.EqualValues(t, 1, merr.Offset)
	require.ErrorIs(t, p0, errSentinel, "the handler's own error is reachable")
	var wrapped error = fmt.Errorf("app: %w", p0)
	var perr *consumer.PartitionError
	require.True(t, errors.As(wrapped, &perr))
	require.Equal(t, 0, perr.Partition)

	var cf *consumer.FingerprintConflictError
	require.True(t, errors.As(p1, &cf), "%v", p1)
	require.ErrorIs(t, p1, consumer.ErrFingerprintConflict)
	require.Equal(t, "x", cf.MessageID)
	require.EqualValues(t, 1, cf.Offset)
	require.EqualValues(t, 0, cf.Existing.Offset)
	require.Equal(t, e.topic, cf.Existing.Topic)
	require.Len(t, s.conflicts, 1, "the conflict hook is told once")
	require.Equal(t, cf.MessageID, s.conflicts[0].MessageID)
	require.Empty(t, e.letters())
}

// A batch where a permanent failure puts the rest in savepoints, and a
// transient failure behind it then cuts the savepoint transaction short:
// the prefix commits (a partial commit, after which the ladder resets its
// backoffs), the failing message is retried alone until it passes, and
// the rest follow. Every message is applied once, poison set aside once,
// and the effects land in offset order: nothing after the failing message
// is applied before it.
func TestAPartialSavepointCommitThenARetryKeepsOrder(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		e.db.Exec(t, `CREATE TABLE `+e.db.Table("ordered")+` (seq bigserial PRIMARY KEY, message_id text NOT NULL, kafka_offset bigint NOT NULL)`)
		// 0..11: poison at 2 and 8, flaky at 5 (fails three times).
		var msgs []kafka.Message
		var good []string
		for i := 0; i < 12; i++ {
			id := "m-" + itoa(int64(i))
			switch i {
			case 2, 8:
				id = "poison-" + itoa(int64(i))
			case 5:
				id = "flaky"
			}
			if i != 2 && i != 8 {
				good = append(good, id)
			}
			msgs = append(msgs, msg(0, id, "v-"+id))
		}
		e.kafka.Produce(t, e.topic, msgs...)
		var flakyCalls atomic.Int32
		ins := `INSERT INTO ` + e.db.Table("ordered") + ` (message_id, kafka_offset) VALUES ($1, $2)`
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if _, err := tx.Exec(ctx, ins, m.ID, m.Offset); err != nil {
				return err
			}
			switch {
			case m.ID == "flaky" && flakyCalls.Add(1) <= 3:
				return errors.New("partner down")
			case m.ID == "poison-2" || m.ID == "poison-8":
				return consumer.Permanent(errors.New("never valid"))
			}
			return e.applyHandler().Handle(ctx, tx, m)
		})
		cfg := e.config(h)
		if batched {
			cfg.Handler, cfg.BatchHandler = nil, eachMessage(h)
		}
		cfg.MaxWait = 50 * time.Millisecond
		cfg.Retry.MaxAttempts = 10
		tp := withTap(cfg)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 12}, 30*time.Second)
		r.stop()

		e.requireExactlyOnce(good)
		var all []string
		for _, m := range msgs {
			all = append(all, string(m.Key))
		}
		e.check(expectation{ids: all, poison: []string{"poison-2", "poison-8"}})
		letters := e.letters()
		require.Len(t, letters, 2)
		require.Equal(t, deadletter.ClassPermanent, letters["poison-2"].Class)
		require.Equal(t, deadletter.ClassPermanent, letters["poison-8"].Class)
		require.Equal(t, 1, letters["poison-2"].Attempts)
		require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("message_attempts")), "attempt rows cleared once the message passed")

		// The committed rows of "ordered" are the applied messages, in
		// offset order.
		rows, err := e.db.Pool.Query(context.Background(), `SELECT kafka_offset FROM `+e.db.Table("ordered")+` ORDER BY seq`)
		require.NoError(t, err)
		offs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.Equal(t, []int64{0, 1, 3, 4, 5, 6, 7, 9, 10, 11}, offs, "applied once each, in offset order")

		s := tp.snap()
		require.Len(t, s.deadFor(2), 1)
		require.Len(t, s.deadFor(8), 1)
		fl := s.failedFor(5)
		require.NotEmpty(t, fl)
		for i, f := range fl {
			require.False(t, f.f.Permanent)
			require.Equal(t, deadletter.ClassRetriesExhausted, f.f.Class)
			if i > 0 {
				require.Equal(t, fl[i-1].f.Attempt+1, f.f.Attempt, "attempts counted one by one")
			}
		}
		require.Empty(t, s.deadFor(5))
	})
}

// A transaction that gives up waiting for the consumer's gate is retried
// at once, without a wait (the ladder's "gate busy" case, now shared by a
// batch, a message alone and a letter). That must not become a loop:
// with the gate held by someone else and a row the handler needs locked
// elsewhere, the partition's transactions are counted over a few seconds
// and must stay few (each waits for a lock or the gate); and once both are
// released everything applies once, with nothing set aside.
func TestAGateHeldElsewhereDoesNotSpinThePartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	acc := e.db.Table("accounts")
	e.db.Exec(t, `CREATE TABLE `+acc+` (id int PRIMARY KEY, n bigint NOT NULL)`)
	e.db.Exec(t, `INSERT INTO `+acc+` VALUES (1, 0), (2, 0)`)
	ctx := context.Background()

	// A row lock held outside the consumer: the first race is lost to it
	// (a lock timeout), which closes the consumer's gate.
	rowConn, err := e.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	rowTx, err := rowConn.Begin(ctx)
	require.NoError(t, err)
	_, err = rowTx.Exec(ctx, `SELECT 1 FROM `+acc+` WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)

	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		id := 1 + m.Partition
		if _, err := tx.Exec(ctx, `UPDATE `+acc+` SET n = n + 1 WHERE id = $1`, id); err != nil {
			return fmt.Errorf("update: %w", err)
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.LockTimeout = 300 * time.Millisecond
	tp := withTap(cfg)
	var ids []string
	var msgs []kafka.Message
	for i := 0; i < 20; i++ {
		id := "g-" + itoa(int64(i))
		ids = append(ids, id)
		msgs = append(msgs, msg(0, id, "v-"+id))
	}
	e.kafka.Produce(t, e.topic, msgs...)
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "a lost race", func() bool { return len(tp.snap().contention) > 0 })

	// Now the gate too is held elsewhere, by a session-level lock on the
	// consumer's key.
	gateConn, err := e.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = gateConn.Exec(ctx, `SELECT pg_advisory_lock($1::int4, $2::int4)`, int32(0x6b6f6e63), gateKeyOf(e.db.Schema, e.name))
	require.NoError(t, err)

	// Partition 1 has its own row: it must keep moving meanwhile.
	e.kafka.Produce(t, e.topic, msg(1, "other-0", "v"), msg(1, "other-1", "v"))

	from := len(tp.snap().starts)
	const window = 4 * time.Second
	time.Sleep(window)
	inWindow := tp.snap().starts[from:]
	n := len(inWindow)
	serialized, racing := 0, 0
	for _, b := range inWindow {
		if b.Serialized {
			serialized++
		} else {
			racing++
		}
	}
	t.Logf("in the window: %d serialized, %d racing", serialized, racing)
	require.Positive(t, serialized, "some transactions waited at the gate (and gave up)")
	require.Positive(t, racing, "after giving up at the gate, the partition raced")
	t.Logf("%d transactions began in %v with the gate and the row held elsewhere", n, window)
	require.Less(t, n, 150, "the partition spins: transactions are retried without a wait")
	require.EqualValues(t, 2, e.storedPositions()[1], "partition 1, on a free row, went on while the gate was held")

	_, err = gateConn.Exec(ctx, `SELECT pg_advisory_unlock($1::int4, $2::int4)`, int32(0x6b6f6e63), gateKeyOf(e.db.Schema, e.name))
	require.NoError(t, err)
	require.NoError(t, rowTx.Rollback(ctx))
	gateConn.Release()
	rowConn.Release()
	e.waitCommitted(map[int]int64{0: 20, 1: 2}, 30*time.Second)
	r.stop()
	e.requireExactlyOnce(append(ids, "other-0", "other-1"))
	e.check(expectation{ids: append(ids, "other-0", "other-1")})
	require.Empty(t, e.letters(), "contention is never a message's failure")
	require.Empty(t, tp.snap().failed)
}

// A message that failed once goes alone (runAlone, now on the shared
// ladder). Alone, it meets a row locked outside the consumer: its lock
// timeouts are contention, never attempts, however many; once the row is
// free it is applied, not set aside for running out of its two attempts.
func TestAMessageAloneMeetingContentionIsNotCounted(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	acc := e.db.Table("accounts")
	e.db.Exec(t, `CREATE TABLE `+acc+` (id int PRIMARY KEY, n bigint NOT NULL)`)
	e.db.Exec(t, `INSERT INTO `+acc+` VALUES (1, 0)`)
	ctx := context.Background()
	outside, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = outside.Rollback(ctx) }()
	_, err = outside.Exec(ctx, `SELECT 1 FROM `+acc+` WHERE id = 1 FOR UPDATE`)
	require.NoError(t, err)

	var first atomic.Bool
	var touched atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "flaky" {
			if first.CompareAndSwap(false, true) {
				return errors.New("partner down") // a counted failure: the message goes alone
			}
			touched.Add(1)
			if _, err := tx.Exec(ctx, `UPDATE `+acc+` SET n = n + 1 WHERE id = 1`); err != nil {
				return fmt.Errorf("update: %w", err)
			}
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.LockTimeout = 150 * time.Millisecond
	cfg.Retry.MaxAttempts = 2
	tp := withTap(cfg)
	ids := []string{"a", "flaky", "b"}
	e.kafka.Produce(t, e.topic, msg(0, "a", "v"), msg(0, "flaky", "v"), msg(0, "b", "v"))
	r := e.start(cfg)
	waitFor(t, 20*time.Second, "the message alone losing to the held row", func() bool { return touched.Load() >= 4 })
	require.EqualValues(t, 1, e.storedPositions()[0], "nothing past the message alone")
	require.NoError(t, outside.Commit(ctx))
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	r.stop()
	e.requireExactlyOnce(ids)
	e.check(expectation{ids: ids})
	s := tp.snap()
	require.Len(t, s.failedFor(1), 1, "only the handler's own failure counted")
	require.NotEmpty(t, s.contention)
	require.EqualValues(t, 1, e.db.Int(t, `SELECT n FROM `+acc+` WHERE id = 1`))
}

// Setting a message aside (setAside, on the shared ladder) meets a
// dead_letters table locked outside the consumer: its letter's insert
// times out again and again, which is retried (contention), not skipped
// and not turned into a stop. Released, exactly one letter is written and
// the partition goes on. Locked again for a second poison, shutdown ends
// Run promptly, and the next run writes that letter.
func TestSetAsideWaitsOutALockedLetterTableAndStopsOnShutdown(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := context.Background()
	lockLetters := func() pgx.Tx {
		tx, err := e.db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `LOCK TABLE `+e.db.Table("dead_letters")+` IN EXCLUSIVE MODE`)
		require.NoError(t, err)
		return tx
	}
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if len(m.ID) > 6 && m.ID[:6] == "poison" {
			return errors.New("partner down") // transient, but MaxAttempts is 1: set aside
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.LockTimeout = 100 * time.Millisecond
	cfg.Retry.MaxAttempts = 1
	tp := withTap(cfg)
	starts := func(offset int64) int {
		n := 0
		for _, b := range tp.snap().starts {
			if b.FirstOffset == offset {
				n++
			}
		}
		return n
	}

	held := lockLetters()
	e.kafka.Produce(t, e.topic, msg(0, "a", "v"), msg(0, "poison-1", "v"), msg(0, "b", "v"))
	r := e.start(cfg)
	waitFor(t, 20*time.Second, "the letter's insert retried", func() bool { return starts(1) >= 5 })
	require.EqualValues(t, 1, e.storedPositions()[0], "not past the message being set aside")
	require.Empty(t, tp.snap().stopped)
	require.NoError(t, held.Rollback(ctx))
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)

	held = lockLetters()
	e.kafka.Produce(t, e.topic, msg(0, "poison-2", "v"), msg(0, "c", "v"))
	waitFor(t, 20*time.Second, "the second letter's insert retried", func() bool { return starts(3) >= 3 })
	began := time.Now()
	r.stop()
	require.Less(t, time.Since(began), 4*time.Second, "shutdown while setting a message aside")
	require.NoError(t, held.Rollback(ctx))
	require.EqualValues(t, 3, e.storedPositions()[0])

	r = e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	r.stop()
	all := []string{"a", "poison-1", "b", "poison-2", "c"}
	e.check(expectation{ids: all, poison: []string{"poison-1", "poison-2"}})
	require.Equal(t, deadletter.ClassRetriesExhausted, e.letters()["poison-1"].Class)
}

// A BatchHandler call over several messages that hangs, ignoring its
// context, is abandoned after HandlerTimeout and the grace. The call does
// not say which message hung, as a failing call does not: the messages
// must be told apart (one per call) before any is blamed. With
// MaxAttempts 1, a message blamed for another's hang is set aside at
// once: only the message that hangs may be.
func TestAHungBatchHandlerCallBlamesNoInnocentMessage(t *testing.T) {
	t.Parallel()
	bothWays(t, batchPaths, func(t *testing.T, claimFirst bool) {
		e := setup(t, 1)
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		apply := e.queueEffects()
		cfg := e.config(nil)
		cfg.Handler = nil
		cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
			for _, m := range b.Messages {
				if m.ID == "hangs" {
					<-release // ignores ctx
					return errors.New("released")
				}
			}
			return apply.HandleBatch(ctx, b)
		})
		cfg.ClaimFirst = claimFirst
		cfg.HandlerTimeout = 200 * time.Millisecond
		cfg.Retry.MaxAttempts = 1
		tp := withTap(cfg)
		e.kafka.Produce(t, e.topic, msg(0, "innocent", "v"), msg(0, "hangs", "v"), msg(0, "after", "v"))
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 3}, 25*time.Second)
		r.stop()
		letters := e.letters()
		_, innocentSetAside := letters["innocent"]
		require.Falsef(t, innocentSetAside, "the message before the hung one was set aside for its hang: %+v", letters["innocent"])
		require.Contains(t, letters, "hangs")
		e.requireExactlyOnce([]string{"innocent", "after"})
		for _, f := range tp.snap().failedFor(0) {
			t.Logf("failure reported for the innocent message: %v", f.f.Err)
		}
	})
}
