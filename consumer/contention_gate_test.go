package consumer_test

// The consumer's gate and the racing lock timeout (see
// internal/engine/contention.go) under slow handlers, rows locked
// elsewhere, and shutdown.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/pace"
)

// failures counts OnMessageFailed reports, by message id.
type failureLog struct {
	mu   sync.Mutex
	byID map[string][]consumer.Failure
}

func (f *failureLog) OnMessageFailed(_ context.Context, m *consumer.Message, fl consumer.Failure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byID == nil {
		f.byID = map[string][]consumer.Failure{}
	}
	f.byID[m.ID] = append(f.byID[m.ID], fl)
}

func (f *failureLog) snapshot() map[string][]consumer.Failure {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][]consumer.Failure{}
	for k, v := range f.byID {
		out[k] = append([]consumer.Failure(nil), v...)
	}
	return out
}

// holdRowLock opens a session of its own that locks row id of table
// FOR UPDATE and keeps its transaction open until release is called
// (release commits).
func holdRowLock(t *testing.T, e *env, table string, id int) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := e.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM `+table+` WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = tx.Commit(ctx)
			conn.Release()
		})
	}
	t.Cleanup(release)
	return release
}

// A batch of several messages races with lock_timeout 200ms. A row held
// elsewhere for 700ms (well within LockTimeout) fails the handler's
// statement, and the handler wraps the error with %v, hiding its SQLSTATE.
// The failure must not count: the message is tried alone, outside the
// race, where it waits for the lock, and nothing is reported or set aside
// (MaxAttempts 1 would set it aside at its first counted failure).
func TestARacingBatchsOwnLockTimeoutIsNotAMessageFailure(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	hot := hotRow(t, e)
	release := holdRowLock(t, e, hot, 1)
	go func() { time.Sleep(700 * time.Millisecond); release() }()

	effect := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Value) == "hot" {
			if _, err := tx.Exec(ctx, `UPDATE `+hot+` SET v = v + 1 WHERE id = 1`); err != nil {
				return fmt.Errorf("bump hot row: %v", err) // not %w
			}
		}
		return nil
	})
	cfg := e.config(h)
	cfg.Retry.MaxAttempts = 1
	fails := &failureLog{}
	cfg.Hooks = append(cfg.Hooks, fails)
	ids := []string{"cold-0", "hot-1", "cold-2"}
	e.kafka.Produce(t, e.topic, msg(0, ids[0], "cold"), msg(0, ids[1], "hot"), msg(0, ids[2], "cold"))
	r := e.start(cfg)
	waitFor(t, 20*time.Second, "three messages done", func() bool {
		return e.distinctEffects()+e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")) >= 3
	})
	r.stop()
	for id, fs := range fails.snapshot() {
		for _, f := range fs {
			t.Logf("reported failure of %s: attempt %d permanent=%v: %v", id, f.Attempt, f.Permanent, f.Err)
		}
	}
	t.Logf("dead letters: %d (%s)", e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")),
		letterClasses(t, e))
	require.Empty(t, fails.snapshot(), "no message failed: the only error was kafkaonce's own race lock_timeout on a lock held for 700ms")
	e.check(expectation{ids: ids})
}

// onceSignal is closed once.
type onceSignal struct {
	once sync.Once
	ch   chan struct{}
}

func newOnceSignal() *onceSignal { return &onceSignal{ch: make(chan struct{})} }
func (s *onceSignal) fire()      { s.once.Do(func() { close(s.ch) }) }

// Once the consumer's gate is closed, a serialized transaction holds it
// while its handler runs. A handler that hangs (cut off only after
// HandlerTimeout) must not stop the other partitions: they wait at the
// gate for pace.GateWait at most, then race.
func TestAHungHandlerAtTheGateHoldsUpOnlyItsPartition(t *testing.T) {
	t.Parallel()
	const parts = 4
	e := setup(t, parts)

	var deadlockOnce atomic.Bool
	hang := newOnceSignal()
	released := newOnceSignal()
	effect := e.applyHandler()
	var mu sync.Mutex
	appliedAt := map[string]time.Time{}
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch string(m.Value) {
		case "lose-a-race":
			// One lost race (as a real deadlock on a hot row would
			// report it): the consumer's gate closes.
			if deadlockOnce.CompareAndSwap(false, true) {
				return fmt.Errorf("post: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
			}
		case "hang":
			hang.fire()
			select {
			case <-ctx.Done():
			case <-released.ch:
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		mu.Lock()
		appliedAt[m.ID] = time.Now()
		mu.Unlock()
		return nil
	})
	cfg := e.config(h)
	cfg.HandlerTimeout = 8 * time.Second
	cfg.Retry.MaxAttempts = 2
	seen := &contentions{}
	cfg.Hooks = append(cfg.Hooks, seen)
	e.kafka.Produce(t, e.topic, msg(0, "race-0", "lose-a-race"), msg(0, "race-1", "x"))
	r := e.start(cfg)
	e.waitEffects(2, 20*time.Second)
	n, _, _ := seen.count()
	require.Positive(t, n, "the lost race was reported")

	// Partition 0's handler now hangs (an HTTP call without a timeout,
	// say) while the consumer is serialized.
	e.kafka.Produce(t, e.topic, msg(0, "hang-0", "hang"))
	select {
	case <-hang.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the hanging message never reached its handler")
	}
	time.Sleep(200 * time.Millisecond)
	producedAt := time.Now()
	var others []string
	for p := 1; p < parts; p++ {
		id := fmt.Sprintf("other-%d", p)
		others = append(others, id)
		e.kafka.Produce(t, e.topic, msg(p, id, "x"))
	}
	// How long the stall lasts when the handler stays hung (it is cut off
	// after HandlerTimeout + 2s).
	waitFor(t, 30*time.Second, "other partitions applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range others {
			if _, ok := appliedAt[id]; !ok {
				return false
			}
		}
		return true
	})
	// Other partitions are independent of partition 0: a couple of
	// seconds is plenty.
	var late []string
	mu.Lock()
	for _, id := range others {
		d := appliedAt[id].Sub(producedAt)
		t.Logf("%s applied %v after it was produced (partition 0's handler hung; HandlerTimeout %v)", id, d.Round(10*time.Millisecond), cfg.HandlerTimeout)
		if d > 3*time.Second {
			late = append(late, fmt.Sprintf("%s (after %v)", id, d))
		}
	}
	mu.Unlock()
	released.fire()
	e.waitEffects(3+len(others), 30*time.Second)
	r.stop()
	require.Empty(t, late, "other partitions progressed while partition 0's handler hung")
}

// Run returns within ShutdownTimeout after cancel while its workers wait
// at a gate another session holds, with no LockTimeout or
// StatementTimeout to end the wait.
func TestShutdownWhileWaitingAtTheGate(t *testing.T) {
	t.Parallel()
	const parts = 3
	e := setup(t, parts)
	var deadlockOnce atomic.Bool
	effect := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if string(m.Value) == "lose-a-race" && deadlockOnce.CompareAndSwap(false, true) {
			return fmt.Errorf("post: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
		}
		return effect.Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.LockTimeout = consumer.LeaveUnset
	cfg.StatementTimeout = consumer.LeaveUnset
	cfg.ShutdownTimeout = 2 * time.Second
	e.kafka.Produce(t, e.topic, msg(0, "race-0", "lose-a-race"))
	r := e.start(cfg)
	e.waitEffects(1, 20*time.Second)

	// Another process of the consumer takes the gate and hangs (its
	// class and key: see consumer/contention.go).
	holdGate(t, e)

	e.kafka.Produce(t, e.topic, msg(1, "w-1", "x"), msg(2, "w-2", "x"))
	waitFor(t, 10*time.Second, "workers waiting at the gate", waitingAtGate(t, e))
	stopsWithin(t, r, cfg.ShutdownTimeout+8*time.Second)
}

// A racing transaction's lock_timeout is 200ms, or LockTimeout when that
// is shorter: the consumer never waits longer than it was told to.
func TestTheRacingLockTimeoutNeverExceedsLockTimeout(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	effect := e.applyHandler()
	var mu sync.Mutex
	seenTimeouts := map[string]int{}
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var lt string
		if err := tx.QueryRow(ctx, `SHOW lock_timeout`).Scan(&lt); err != nil {
			return err
		}
		mu.Lock()
		seenTimeouts[lt]++
		mu.Unlock()
		return effect.Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.LockTimeout = 50 * time.Millisecond
	ids := []string{"a", "b", "c", "d"}
	var msgs []kafka.Message
	for _, id := range ids {
		msgs = append(msgs, msg(0, id, "x"))
	}
	e.kafka.Produce(t, e.topic, msgs...)
	r := e.start(cfg)
	e.waitEffects(len(ids), 20*time.Second)
	r.stop()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("lock_timeout seen by the handlers: %v", seenTimeouts)
	require.Equal(t, map[string]int{"50ms": len(ids)}, seenTimeouts, "handlers ran with the configured LockTimeout")
}

// A row kept locked by a forgotten session, and one message of partition 0
// that touches it: its lock timeouts close the consumer's gate, and its
// serialized retries hold the gate for LockTimeout each. The other
// partitions must not queue behind it for that long: they wait at the gate
// for pace.GateWait at most, then race.
func TestARowLockedElsewhereHoldsUpOnlyItsPartition(t *testing.T) {
	t.Parallel()
	const parts = 3
	e := setup(t, parts)
	hot := hotRow(t, e)
	holdRowLock(t, e, hot, 1)

	effect := e.applyHandler()
	var mu sync.Mutex
	appliedAt := map[string]time.Time{}
	var hotCalls atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Value) == "hot" {
			hotCalls.Add(1)
			if _, err := tx.Exec(ctx, `UPDATE `+hot+` SET v = v + 1 WHERE id = 1`); err != nil {
				return fmt.Errorf("bump hot row: %w", err)
			}
		}
		mu.Lock()
		appliedAt[m.ID] = time.Now()
		mu.Unlock()
		return nil
	})
	cfg := e.config(h)
	// Long enough that queueing behind each retry (LockTimeout a time)
	// shows clearly above a wait at the gate plus a real broker's fetch
	// latency.
	cfg.LockTimeout = 4 * time.Second
	r := e.start(cfg)
	e.kafka.Produce(t, e.topic, msg(0, "stuck-0", "hot"))
	waitFor(t, 30*time.Second, "the partition 0 message failed once and is retried", func() bool { return hotCalls.Load() >= 2 })

	// A steady trickle on the other partitions.
	producedAt := map[string]time.Time{}
	for i := range 20 {
		id := fmt.Sprintf("other-%d", i)
		producedAt[id] = time.Now()
		e.kafka.Produce(t, e.topic, msg(1+i%(parts-1), id, "cold"))
		time.Sleep(250 * time.Millisecond)
	}
	waitFor(t, 60*time.Second, "the trickle applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for id := range producedAt {
			if _, ok := appliedAt[id]; !ok {
				return false
			}
		}
		return true
	})
	r.stop()
	mu.Lock()
	defer mu.Unlock()
	var worst time.Duration
	var total time.Duration
	for id, at := range producedAt {
		d := appliedAt[id].Sub(at)
		total += d
		worst = max(worst, d)
	}
	t.Logf("other partitions: worst latency %v, mean %v (LockTimeout %v)", worst.Round(10*time.Millisecond),
		(total / time.Duration(len(producedAt))).Round(10*time.Millisecond), cfg.LockTimeout)
	require.Less(t, worst, pace.GateWait+2*time.Second, "partitions 1 and 2 are held up by partition 0's failing message no longer than a wait at the gate (and the broker's fetch latency)")
}

// Run returns within ShutdownTimeout and the handler grace after cancel
// when a handler that ignores its context holds the consumer's gate and
// the other partitions wait behind it.
func TestShutdownWithAHungHandlerHoldingTheGate(t *testing.T) {
	t.Parallel()
	const parts = 3
	e := setup(t, parts)
	var deadlockOnce atomic.Bool
	hang := newOnceSignal()
	forever := make(chan struct{})
	t.Cleanup(func() { close(forever) })
	effect := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch string(m.Value) {
		case "lose-a-race":
			if deadlockOnce.CompareAndSwap(false, true) {
				return fmt.Errorf("post: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
			}
		case "hang":
			hang.fire()
			<-forever
			return errors.New("released")
		}
		return effect.Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.HandlerTimeout = 30 * time.Second
	cfg.ShutdownTimeout = 2 * time.Second
	e.kafka.Produce(t, e.topic, msg(0, "race-0", "lose-a-race"))
	r := e.start(cfg)
	e.waitEffects(1, 20*time.Second)
	e.kafka.Produce(t, e.topic, msg(0, "hang-0", "hang"))
	<-hang.ch
	e.kafka.Produce(t, e.topic, msg(1, "w-1", "x"), msg(2, "w-2", "x"))
	waitFor(t, 10*time.Second, "workers waiting at the gate", waitingAtGate(t, e))
	stopsWithin(t, r, cfg.ShutdownTimeout+8*time.Second)
}

// A BatchHandler that only queues (one round trip per batch) on four hot
// rows, queued in message order: each transfer is posted once, no attempt
// is counted, nothing is set aside.
func TestAOneTripStormOnHotRows(t *testing.T) {
	t.Parallel()
	const partitions, transfers = 6, 3000
	e := setup(t, partitions)
	l := newLedger(e, 4)
	ids := l.produce("bt", transfers, 7)
	insert := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
	var calls atomic.Int64
	bh := consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
		calls.Add(1)
		for _, m := range b.Messages {
			var tr transfer
			if _, err := fmt.Sscanf(string(m.Value), "%d:%d", &tr.from, &tr.to); err != nil {
				return consumer.Permanent(err)
			}
			b.Queue(insert, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
			l.queue(b, tr)
		}
		return nil
	})
	seen := &contentions{}
	cfg := e.config(nil)
	cfg.Handler = nil
	cfg.BatchHandler = bh
	cfg.MaxBatch = consumer.DefaultMaxBatch
	cfg.Hooks = append(cfg.Hooks, seen)
	r := e.start(cfg)
	e.waitEffects(transfers, 90*time.Second)
	r.stop()
	l.requireBalanced(transfers)
	e.check(expectation{ids: ids})
	n, serialized, failed := seen.count()
	t.Logf("contentions %d (serialized %d), handler calls %d", n, serialized, calls.Load())
	require.Zero(t, failed)
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("message_attempts")))
}

func gateKeyOf(schemaName, name string) int32 {
	// fnv32a(schema, 0, name), as consumer.gateKey.
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for _, b := range append(append([]byte(schemaName), 0), name...) {
		h ^= uint32(b)
		h *= prime
	}
	return int32(h)
}

func letterClasses(t *testing.T, e *env) string {
	rows, err := e.db.Pool.Query(context.Background(), `SELECT message_id, error_class, error FROM `+e.db.Table("dead_letters")+` ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	out := ""
	for rows.Next() {
		var id, class, msg string
		require.NoError(t, rows.Scan(&id, &class, &msg))
		out += fmt.Sprintf("[%s %s: %s] ", id, class, msg)
	}
	return out
}

var _ = errors.New

// hotRow creates a table of one row, id 1, for tests to lock and update.
func hotRow(t *testing.T, e *env) string {
	t.Helper()
	hot := e.db.Table("hot_row")
	e.db.Exec(t, `CREATE TABLE `+hot+` (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)`)
	e.db.Exec(t, `INSERT INTO `+hot+` (id) VALUES (1)`)
	return hot
}

// stopsWithin cancels r and requires Run to return nil within d.
func stopsWithin(t *testing.T, r *running, d time.Duration) {
	t.Helper()
	began := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		require.NoError(t, err)
	case <-time.After(d):
		t.Fatalf("Run did not return within %v of cancel", d)
	}
	r.done = nil
	t.Logf("Run returned %v after cancel", time.Since(began))
}
