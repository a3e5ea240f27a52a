package consumer_test

// Adversarial review (round 2) of the contention fixes: the bounded wait at
// the gate, the lock_timeout restored after it, uncounted failures of
// racing transactions.

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

// Finding 1. Under REPEATABLE READ (the pool's default isolation, a case
// guarantee.md names), a transaction's snapshot is taken by its first
// statement: the session settings, sent before pg_advisory_xact_lock. A
// serialized transaction that waited its turn at the gate therefore reads
// a snapshot from before the turn of the transaction it waited for, and
// its first write to a row that one wrote fails with 40001. Taking turns
// was meant to make the consumer's transactions "commit one after another
// and cannot deadlock each other"; under REPEATABLE READ every one that
// had to wait loses to its predecessor.
//
// Interleaving: the gate is closed (one lost race). Another process of the
// consumer holds the gate and posts to the hot row. Our partition's
// transaction BEGINs, sets its session settings (snapshot taken), waits at
// the gate; the other commits (gate free); ours runs UPDATE hot -> 40001.
func TestReviewATurnAtTheGateUnderRepeatableReadLosesToTheTurnBefore(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	hot := e.db.Table("hot_row")
	e.db.Exec(t, `CREATE TABLE `+hot+` (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)`)
	e.db.Exec(t, `INSERT INTO `+hot+` (id) VALUES (1)`)
	pool := e.db.PoolVia(t, e.db.ServerAddr(t), func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	})
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
	require.Empty(t, log.lostSerialized(1),
		"a transaction that waited its turn at the gate lost a race to the turn before it (its REPEATABLE READ snapshot predates the wait)")
}

// Finding 2. The bound on a wait at the gate (pace.GateWait, 1s) works only
// through lock_timeout's 55P03. With a StatementTimeout under a second
// (validate accepts anything from 1ms), statement_timeout ends the wait
// first, with 57014: not gateBusy, not contention, but an infrastructure
// failure. The worker logs "batch failed; retrying", backs off, and its
// next transaction takes the gate again (skipGate is false): the partition
// queues behind a stuck holder for as long as it is stuck, which is what
// the fix was meant to end. (With the default StatementTimeout the same
// test passes: see the subtest.)
func TestReviewAStatementTimeoutUnderGateWaitQueuesBehindAStuckHolder(t *testing.T) {
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

// Finding 3. With LockTimeout: LeaveUnset the consumer promises to keep
// the session's lock_timeout. A pool that sets it per session (AfterConnect
// `SET lock_timeout`, or a pooler's connect query) gets it in every
// transaction but a serialized one: afterGate restores with
// `SET LOCAL lock_timeout TO DEFAULT`, which is the reset value (config
// file, role, database, startup packet), not the session's SET. Here the
// handler of a serialized transaction runs with lock_timeout 0 (wait
// forever, holding the gate) instead of 150ms.
func TestReviewLeaveUnsetKeepsTheSessionLockTimeoutAfterTheGate(t *testing.T) {
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

// Finding 4. MaxAttempts no longer bounds the handler's failures. A
// failure in a racing transaction after which the server holds the
// transaction aborted is uncounted, whatever its SQLSTATE: here the
// handler's error wraps (%w) a 42703 undefined_column, plainly not the
// race's lock timeout. The message is then tried alone MaxAttempts times,
// so the handler fails MaxAttempts+1 times; with MaxAttempts 1 ("no
// retries") it is retried once, and the letter says 1 attempt.
func TestReviewMaxAttemptsBoundsHandlerFailuresInARacingBatch(t *testing.T) {
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
			cfg.MaxAttempts = maxAttempts
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

// Finding 1, its consequence: under REPEATABLE READ, two partitions posting
// to one hot row. Once serialized, the partition that just committed takes
// the gate again at once with a fresh snapshot, while the one that queued
// behind it holds a stale snapshot and fails with 40001 every time it gets
// its turn. The queued partition loses race after race while the other
// drains: turns at the gate do not take turns.
func TestReviewUnderRepeatableReadTheGateStarvesTheQueuedPartition(t *testing.T) {
	t.Parallel()
	const parts = 2
	e := setup(t, parts)
	hot := e.db.Table("hot_row")
	e.db.Exec(t, `CREATE TABLE `+hot+` (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)`)
	e.db.Exec(t, `INSERT INTO `+hot+` (id) VALUES (1)`)
	pool := e.db.PoolVia(t, e.db.ServerAddr(t), func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	})
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
		require.Lessf(t, st.serial[p], 10, "partition %d: serialized transactions lost %d races, though only the consumer writes the row and its transactions take turns", p, st.serial[p])
	}
}

// Probe (holds): a BatchHandler that fails, for one message, with a SQL
// error wrapped by %v (after which the transaction is aborted) in a
// multi-message racing batch, with a permanent poison message earlier in
// the batch: the batch isolates, the poison is set aside, the failing
// message is tried alone and set aside after MaxAttempts; nothing loops.
func TestReviewProbeBatchHandlerPercentVFailureTerminates(t *testing.T) {
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
	cfg.MaxAttempts = 2
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
	t.Logf("bad-sql handler calls: %d (MaxAttempts %d)", badCalls.Load(), cfg.MaxAttempts)
}
