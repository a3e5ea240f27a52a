package consumer_test

// The limits around contention: the bounded wait at the gate and the
// timeouts put back after it, which failures of racing transactions count,
// and what the gate does not do under REPEATABLE READ.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// txLog records, per contention report, whether the transaction that lost
// had taken the gate (BatchInfo.Serialized), and, per batch start, the
// same.
type txLog struct {
	mu         sync.Mutex
	lost       []consumer.BatchInfo
	lostErrs   []string
	serialized map[int64]bool // first offset of a started batch -> serialized
}

func (l *txLog) OnContention(_ context.Context, b consumer.BatchInfo, c consumer.Contention) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lost = append(l.lost, b)
	l.lostErrs = append(l.lostErrs, c.Err.Error())
}

func (l *txLog) OnBatchStart(_ context.Context, b consumer.BatchInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.serialized == nil {
		l.serialized = map[int64]bool{}
	}
	l.serialized[b.FirstOffset] = b.Serialized
}

// lostSerialized returns the contention reports of serialized
// transactions starting at or after offset from.
func (l *txLog) lostSerialized(from int64) (out []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, b := range l.lost {
		if b.Serialized && b.FirstOffset >= from {
			out = append(out, fmt.Sprintf("offset %d (serialized, %d messages): %s", b.FirstOffset, b.Size, l.lostErrs[i]))
		}
	}
	return out
}

// holdGate takes the consumer's gate in a session of its own, as a
// serialized transaction of another process of the same consumer does. The
// returned tx holds it until it ends.
func holdGate(t *testing.T, e *env) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, int32(0x6b6f6e63), gateKeyOf(e.db.Schema, e.name))
	require.NoError(t, err)
	return tx
}

func waitingAtGate(t *testing.T, e *env) func() bool {
	return func() bool {
		return e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND application_name = $1`, e.db.Schema) >= 1
	}
}

// loseOneRace returns a handler wrapper whose first call for a message
// with value "lose-a-race" reports a deadlock (as a real one on a hot row
// would): the consumer's gate closes for pace.Hold (15s).
func loseOneRace(next consumer.HandlerFunc) consumer.HandlerFunc {
	var once atomic.Bool
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if string(m.Value) == "lose-a-race" && once.CompareAndSwap(false, true) {
			return fmt.Errorf("post: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
		}
		return next(ctx, tx, m)
	}
}

// Under REPEATABLE READ (the pool's default isolation) a transaction's
// snapshot is taken by its first statement, before it waits at the gate:
// a transaction that waited for another process's turn, which wrote a row
// it writes too, loses with 40001 when its turn comes (a limit design.md
// names). It runs again, is never counted, and applies once.
func TestUnderRepeatableReadATurnAtTheGateMayLoseToTheTurnBefore(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	hot := hotRow(t, e)
	pool := repeatableReadPool(t, e)
	effect := e.applyHandler()
	h := loseOneRace(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Value) == "bump" {
			if _, err := tx.Exec(ctx, `UPDATE `+hot+` SET v = v + 1 WHERE id = 1`); err != nil {
				return fmt.Errorf("bump: %w", err)
			}
		}
		return nil
	})
	log := &txLog{}
	cfg := e.config(h)
	cfg.Hooks = append(cfg.Hooks, log)
	e.kafka.Produce(t, e.topic, msg(0, "race-0", "lose-a-race"))
	r := e.start(cfg, pool)
	e.waitEffects(1, 20*time.Second)

	// Another process's serialized transaction: takes the gate, bumps.
	other := holdGate(t, e)
	e.kafka.Produce(t, e.topic, msg(0, "bump-1", "bump"))
	waitFor(t, 10*time.Second, "our transaction waiting its turn at the gate", waitingAtGate(t, e))
	_, err := other.Exec(context.Background(), `UPDATE `+hot+` SET v = v + 1 WHERE id = 1`)
	require.NoError(t, err)
	require.NoError(t, other.Commit(context.Background()))

	e.waitEffects(2, 20*time.Second)
	r.stop()
	require.EqualValues(t, 2, e.db.Int(t, `SELECT v FROM `+hot+` WHERE id = 1`))
	e.check(expectation{ids: []string{"race-0", "bump-1"}})
	t.Logf("serialized transactions that lost: %v", log.lostSerialized(1))
}

// The wait at the gate is bounded by pace.GateWait through a lock_timeout
// of its own, and runs without statement_timeout: a StatementTimeout
// shorter than GateWait must not end the wait first (as a failure that is
// not the gate's, after which the partition would queue again behind a
// stuck holder).
func TestAStatementTimeoutShorterThanTheGateWaitDoesNotQueueBehindAStuckHolder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		st   time.Duration
	}{{"default StatementTimeout", 0}, {"StatementTimeout 500ms", 500 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const parts = 2
			e := setup(t, parts)
			effect := e.applyHandler()
			var mu sync.Mutex
			appliedAt := map[string]time.Time{}
			h := loseOneRace(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if err := effect.Handle(ctx, tx, m); err != nil {
					return err
				}
				mu.Lock()
				appliedAt[m.ID] = time.Now()
				mu.Unlock()
				return nil
			})
			cfg := e.config(h)
			cfg.StatementTimeout = tc.st
			e.kafka.Produce(t, e.topic, msg(0, "race-0", "lose-a-race"))
			r := e.start(cfg)
			e.waitEffects(1, 20*time.Second)

			// Another process of the consumer holds the gate and is stuck
			// (a hung handler, a row locked elsewhere).
			holdGate(t, e)
			producedAt := time.Now()
			e.kafka.Produce(t, e.topic, msg(1, "other-1", "x"))
			deadline := time.Now().Add(pace_GateWait + 4*time.Second)
			for time.Now().Before(deadline) {
				mu.Lock()
				_, ok := appliedAt["other-1"]
				mu.Unlock()
				if ok {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			mu.Lock()
			at, ok := appliedAt["other-1"]
			mu.Unlock()
			r.stop()
			require.Truef(t, ok, "partition 1's message not applied %v after it was produced while another session held the gate (StatementTimeout %v): it keeps queueing at the gate instead of racing after GateWait",
				time.Since(producedAt).Round(10*time.Millisecond), tc.st)
			t.Logf("applied %v after it was produced", at.Sub(producedAt).Round(10*time.Millisecond))
		})
	}
}

const pace_GateWait = time.Second

// With LockTimeout LeaveUnset, a handler in a transaction that took the
// gate sees the lock_timeout the pool's connections set (AfterConnect), as
// handlers outside the gate do: the wait's own timeouts are put back to
// what they were, not to the server's defaults.
func TestLeaveUnsetKeepsTheSessionLockTimeoutAfterTheGate(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	pool := e.db.PoolVia(t, e.db.ServerAddr(t), func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, `SET lock_timeout = '150ms'`)
			return err
		}
	})
	effect := e.applyHandler()
	var mu sync.Mutex
	seen := map[string]string{}
	h := loseOneRace(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var lt string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil {
			return err
		}
		mu.Lock()
		seen[m.ID] = lt
		mu.Unlock()
		return effect.Handle(ctx, tx, m)
	})
	log := &txLog{}
	cfg := e.config(h)
	cfg.LockTimeout = consumer.LeaveUnset
	cfg.Hooks = append(cfg.Hooks, log)
	r := e.start(cfg, pool)
	e.kafka.Produce(t, e.topic, msg(0, "before-0", "x"))
	e.waitEffects(1, 20*time.Second)
	e.kafka.Produce(t, e.topic, msg(0, "race-1", "lose-a-race"))
	e.waitEffects(2, 20*time.Second)
	e.kafka.Produce(t, e.topic, msg(0, "after-2", "x"))
	e.waitEffects(3, 20*time.Second)
	r.stop()
	log.mu.Lock()
	serialized := log.serialized[2]
	log.mu.Unlock()
	require.True(t, serialized, "after-2 ran in a serialized transaction")
	mu.Lock()
	defer mu.Unlock()
	t.Logf("lock_timeout seen by the handler: %v", seen)
	require.Equal(t, "150ms", seen["before-0"], "racing (one message): the session's value")
	require.Equal(t, "150ms", seen["after-2"], "serialized: the session's value, as LeaveUnset promises")
}

// A handler that fails with a SQL error whose SQLSTATE it passes on (%w)
// inside a racing batch of several messages: the failure counts, and the
// handler fails no more than MaxAttempts times before the message is set
// aside. Only failures that hide their SQLSTATE are tried alone uncounted
// (see raceMayHaveFailed).
func TestMaxAttemptsBoundsHandlerFailuresInARacingBatch(t *testing.T) {
	t.Parallel()
	for _, maxAttempts := range []int{1, 3} {
		t.Run(fmt.Sprintf("MaxAttempts %d", maxAttempts), func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			effect := e.applyHandler()
			var calls atomic.Int64
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if string(m.Value) == "bad-sql" {
					calls.Add(1)
					if _, err := tx.Exec(ctx, `SELECT no_such_column FROM `+e.db.Table("effects")); err != nil {
						return fmt.Errorf("report: %w", err) // SQLSTATE visible
					}
				}
				return effect.Handle(ctx, tx, m)
			})
			cfg := e.config(h)
			cfg.Retry.MaxAttempts = maxAttempts
			fails := &failureLog{}
			cfg.Hooks = append(cfg.Hooks, fails)
			ids := []string{"ok-0", "bad-1", "ok-2"}
			e.kafka.Produce(t, e.topic, msg(0, ids[0], "x"), msg(0, ids[1], "bad-sql"), msg(0, ids[2], "x"))
			r := e.start(cfg)
			waitFor(t, 20*time.Second, "bad-1 set aside", func() bool {
				return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE message_id = 'bad-1'`) == 1
			})
			e.waitEffects(2, 20*time.Second)
			r.stop()
			e.check(expectation{ids: ids, poison: []string{"bad-1"}})
			letterAttempts := e.db.Int(t, `SELECT attempts FROM `+e.db.Table("dead_letters")+` WHERE message_id = 'bad-1'`)
			t.Logf("handler failed %d times on bad-1; reported failures %d; the letter says %d attempts (MaxAttempts %d)",
				calls.Load(), len(fails.snapshot()["bad-1"]), letterAttempts, maxAttempts)
			require.EqualValues(t, maxAttempts, calls.Load(), "the handler failed on bad-1 more than MaxAttempts times")
		})
	}
}

// streaks counts, per partition, transactions lost in a row (reset by a
// commit), and the longest such streak of serialized transactions.
type streaks struct {
	mu      sync.Mutex
	cur     map[int]int
	worst   map[int]int
	serial  map[int]int
	commits map[int]int
}

func newStreaks() *streaks {
	return &streaks{cur: map[int]int{}, worst: map[int]int{}, serial: map[int]int{}, commits: map[int]int{}}
}

func (s *streaks) OnContention(_ context.Context, b consumer.BatchInfo, _ consumer.Contention) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur[b.Partition]++
	s.worst[b.Partition] = max(s.worst[b.Partition], s.cur[b.Partition])
	if b.Serialized {
		s.serial[b.Partition]++
	}
}

func (s *streaks) OnBatchEnd(_ context.Context, b consumer.BatchInfo, r consumer.BatchResult) {
	if r.Err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur[b.Partition] = 0
	s.commits[b.Partition]++
}

// Under REPEATABLE READ, two partitions posting to one hot row: turns at
// the gate do not stop serialization failures (the snapshot predates the
// wait; see design.md), but every loss runs again, uncounted, and both
// partitions drain with each message applied once.
func TestUnderRepeatableReadTwoPartitionsOnOneRowDrain(t *testing.T) {
	t.Parallel()
	const parts = 2
	e := setup(t, parts)
	hot := hotRow(t, e)
	pool := repeatableReadPool(t, e)
	effect := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+hot+` SET v = v + 1 WHERE id = 1`)
		time.Sleep(time.Millisecond) // some work between taking the row's lock and COMMIT
		return err
	})
	st := newStreaks()
	cfg := e.config(h)
	cfg.Hooks = append(cfg.Hooks, st)
	const n = 4000
	ids := e.produceIDs("rr", n)
	r := e.start(cfg, pool)
	e.waitEffects(n, 120*time.Second)
	r.stop()
	e.check(expectation{ids: ids})
	require.EqualValues(t, n, e.db.Int(t, `SELECT v FROM `+hot+` WHERE id = 1`))
	st.mu.Lock()
	defer st.mu.Unlock()
	t.Logf("lost races in a row, worst per partition: %v; serialized transactions that lost: %v; commits: %v", st.worst, st.serial, st.commits)
	for p := range parts {
		require.Positivef(t, st.commits[p], "partition %d committed", p)
	}
}

// A BatchHandler that fails, for one message, with a SQL error wrapped by
// %v (its SQLSTATE hidden; the transaction aborted) in a racing batch of
// several messages, with a permanent poison message earlier in the batch:
// the batch isolates, the poison is set aside, the failing message is
// tried alone and set aside after MaxAttempts; nothing loops.
func TestABatchHandlersHiddenSQLErrorIsSetAsideAfterIsolation(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	insert := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
	var badCalls atomic.Int64
	bh := consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
		for _, m := range b.Messages {
			switch string(m.Value) {
			case "poison":
				return consumer.Permanent(fmt.Errorf("poison"))
			case "bad-sql":
				badCalls.Add(1)
				if _, err := b.Tx.Exec(ctx, `SELECT no_such_column FROM `+e.db.Table("effects")); err != nil {
					return fmt.Errorf("report: %v", err)
				}
			}
			if _, err := b.Tx.Exec(ctx, insert, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value)); err != nil {
				return err
			}
		}
		return nil
	})
	cfg := e.config(nil)
	cfg.Handler = nil
	cfg.BatchHandler = bh
	cfg.Retry.MaxAttempts = 2
	ids := []string{"ok-0", "poison-1", "ok-2", "bad-3", "ok-4"}
	vals := []string{"x", "poison", "x", "bad-sql", "x"}
	for i := range ids {
		e.kafka.Produce(t, e.topic, msg(0, ids[i], vals[i]))
	}
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "both set aside", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")) == 2
	})
	e.waitEffects(3, 20*time.Second)
	r.stop()
	e.check(expectation{ids: ids, poison: []string{"poison-1", "bad-3"}})
	t.Logf("bad-sql handler calls: %d (MaxAttempts %d)", badCalls.Load(), cfg.Retry.MaxAttempts)
}
