package consumer_test

// Adversarial tests for the contention change (internal/pace, the
// consumer's gate, the racing lock_timeout, 55P03 as infrastructure).
// Each test states the promise it checks; a failure is a finding.

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
)

// failures counts OnMessageFailed reports, by message id.
type advFailures struct {
	mu   sync.Mutex
	byID map[string][]consumer.Failure
}

func (f *advFailures) OnMessageFailed(_ context.Context, m *consumer.Message, fl consumer.Failure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byID == nil {
		f.byID = map[string][]consumer.Failure{}
	}
	f.byID[m.ID] = append(f.byID[m.ID], fl)
}

func (f *advFailures) snapshot() map[string][]consumer.Failure {
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

// Promise (failures.md, first line): "A failing handler must neither lose
// its message nor block its partition forever". A handler whose statement
// waits for a row that a forgotten session keeps locked fails with
// lock_timeout (55P03) on every attempt. Before the change that was a
// failure that may pass: retried up to MaxAttempts, then set aside, and
// the partition went on. Now 55P03 is "contention": retried without limit
// and never counted, logged at debug level only, so the partition is
// stuck behind that message for as long as the stuck session lives.
func TestAdvLockHeldByStuckSessionBlocksPartitionForever(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	hot := e.db.Table("adv_hot")
	e.db.Exec(t, `CREATE TABLE `+hot+` (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)`)
	e.db.Exec(t, `INSERT INTO `+hot+` (id) VALUES (1)`)
	holdRowLock(t, e, hot, 1) // an operator's psql session left open

	effect := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Value) == "hot" {
			if _, err := tx.Exec(ctx, `UPDATE `+hot+` SET v = v + 1 WHERE id = 1`); err != nil {
				return fmt.Errorf("bump hot row: %w", err)
			}
		}
		return nil
	})
	cfg := e.config(h)
	cfg.LockTimeout = 300 * time.Millisecond
	cfg.MaxAttempts = 2
	fails := &advFailures{}
	cfg.Hooks = append(cfg.Hooks, fails)
	e.kafka.Produce(t, e.topic, msg(0, "stuck-0", "hot"), msg(0, "after-1", "cold"), msg(0, "after-2", "cold"))
	r := e.start(cfg)

	// Two attempts of 300ms each plus backoff: well within 20s before
	// the change.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE message_id = 'stuck-0'`) == 1 &&
			e.distinctEffects() == 2 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	letters := e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE message_id = 'stuck-0'`)
	attempts := e.db.Int(t, `SELECT coalesce(sum(attempts), 0) FROM `+e.db.Table("message_attempts"))
	r.stop()
	t.Logf("after 20s: dead letters for stuck-0: %d, effects: %d, attempt rows' attempts: %d, failures reported: %d",
		letters, e.distinctEffects(), attempts, len(fails.snapshot()["stuck-0"]))
	require.EqualValues(t, 1, letters, "the message whose handler always fails (lock_timeout) was set aside after MaxAttempts")
	require.EqualValues(t, 2, e.distinctEffects(), "the messages after it were applied: the partition was not blocked forever")
}

// Promise: contention is never counted as an attempt of a message, and a
// good message is never set aside for it. The racing lock_timeout (200ms)
// is imposed by kafkaonce on the handler's own statements: a lock that
// another transaction holds for half a second (well within the
// configured LockTimeout of 10s) now fails the handler's statement. A
// handler that reports the error without %w (fmt.Errorf("%v"), a custom
// error type: very common) turns kafkaonce's own timeout into a message
// failure: reported through HookMessageFailed, counted as the first
// attempt, and with MaxAttempts 1 the good message is dead-lettered.
// Before the change the statement simply waited half a second.
func TestAdvRaceLockTimeoutDeadLettersGoodMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	hot := e.db.Table("adv_hot")
	e.db.Exec(t, `CREATE TABLE `+hot+` (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)`)
	e.db.Exec(t, `INSERT INTO `+hot+` (id) VALUES (1)`)
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
	cfg.MaxAttempts = 1
	fails := &advFailures{}
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
		advLetterClasses(t, e))
	require.Empty(t, fails.snapshot(), "no message failed: the only error was kafkaonce's own race lock_timeout on a lock held for 700ms")
	e.check(expectation{ids: ids})
}

// advSignal is closed once.
type advSignal struct {
	once sync.Once
	ch   chan struct{}
}

func newAdvSignal() *advSignal { return &advSignal{ch: make(chan struct{})} }
func (s *advSignal) fire()     { s.once.Do(func() { close(s.ch) }) }

// Promise: no partition starved; a hung handler holds up its own
// partition only (it is cut off after HandlerTimeout, and retried).
// Once any transaction of the consumer lost one race, every transaction
// of the consumer, on every partition and in every process, takes the
// gate first for 15s (doubling up to 4 min). A serialized transaction
// holds the gate while its handler runs, and a single message cannot be
// shrunk: one slow or hung handler then stops every other partition of
// the consumer for up to HandlerTimeout + grace (their gate waits fail
// with lock_timeout and queue again).
func TestAdvHungHandlerHoldingGateStallsOtherPartitions(t *testing.T) {
	t.Parallel()
	const parts = 4
	e := setup(t, parts)

	var deadlockOnce atomic.Bool
	hang := newAdvSignal()
	released := newAdvSignal()
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
	cfg.MaxAttempts = 2
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
	// Other partitions are independent of partition 0: a couple of
	// seconds is plenty.
	time.Sleep(3 * time.Second)
	mu.Lock()
	var late []string
	for _, id := range others {
		at, ok := appliedAt[id]
		if !ok {
			late = append(late, id+" (not applied after 3s)")
		} else if d := at.Sub(producedAt); d > 3*time.Second {
			late = append(late, fmt.Sprintf("%s (after %v)", id, d))
		}
	}
	mu.Unlock()
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
	mu.Lock()
	for _, id := range others {
		t.Logf("%s applied %v after it was produced (partition 0's handler hung; HandlerTimeout %v)", id, appliedAt[id].Sub(producedAt).Round(10*time.Millisecond), cfg.HandlerTimeout)
	}
	mu.Unlock()
	released.fire()
	e.waitEffects(3+len(others), 30*time.Second)
	r.stop()
	require.Empty(t, late, "other partitions progressed while partition 0's handler hung")
}

// Promise: Run returns within ShutdownTimeout + grace after cancel. The
// gate is held by another process of the same consumer (a transaction
// that took it and hangs, with LockTimeout and StatementTimeout unset as
// the config allows): the serialized workers wait at the gate.
func TestAdvShutdownWhileWaitingAtGateHeldElsewhere(t *testing.T) {
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
	ctx := context.Background()
	conn, err := e.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, int32(0x6b6f6e63), advGateKey(e.db.Schema, e.name))
	require.NoError(t, err)

	e.kafka.Produce(t, e.topic, msg(1, "w-1", "x"), msg(2, "w-2", "x"))
	waitFor(t, 10*time.Second, "workers waiting at the gate", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`) >= 1
	})
	began := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		require.NoError(t, err)
		r.done = nil
	case <-time.After(cfg.ShutdownTimeout + 8*time.Second):
		r.done = nil
		t.Fatalf("Run did not return within ShutdownTimeout (%v) + 8s of cancel", cfg.ShutdownTimeout)
	}
	t.Logf("Run returned %v after cancel", time.Since(began))
}

// Promise (guarantee.md, "Bounded sessions"): every transaction sets the
// configured lock_timeout locally. A racing transaction over several
// messages sets lock_timeout to 200ms after the session settings, so a
// consumer configured with a shorter LockTimeout (50ms: a latency-bound
// service that would rather fail fast) has its handlers wait four times
// as long for locks as it asked.
func TestAdvRaceLockTimeoutOverridesAShorterLockTimeout(t *testing.T) {
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

// Promise: a handler that is cut off stays cut off, and its connection
// is closed so that the server rolls back and frees its locks — the gate
// included — also with a DB that only begins transactions. The hung
// handler ignores its context; the consumer is serialized. Once the
// handler is abandoned (HandlerTimeout + 2s), the other partitions go on.
func TestAdvAbandonedHandlerReleasesTheGateWithBeginOnlyDB(t *testing.T) {
	t.Parallel()
	const parts = 3
	e := setup(t, parts)
	var deadlockOnce atomic.Bool
	hang := newAdvSignal()
	forever := make(chan struct{})
	t.Cleanup(func() { close(forever) })
	effect := e.applyHandler()
	var mu sync.Mutex
	appliedAt := map[string]time.Time{}
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch string(m.Value) {
		case "lose-a-race":
			if deadlockOnce.CompareAndSwap(false, true) {
				return fmt.Errorf("post: %w", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"})
			}
		case "hang":
			hang.fire()
			<-forever // ignores ctx
			return errors.New("released")
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
	cfg.HandlerTimeout = 2 * time.Second
	cfg.MaxAttempts = 1
	e.kafka.Produce(t, e.topic, msg(0, "race-0", "lose-a-race"))
	r := e.start(cfg, beginOnly{e.db.Pool})
	e.waitEffects(1, 20*time.Second)
	e.kafka.Produce(t, e.topic, msg(0, "hang-0", "hang"))
	select {
	case <-hang.ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the hanging message never reached its handler")
	}
	producedAt := time.Now()
	for p := 1; p < parts; p++ {
		e.kafka.Produce(t, e.topic, msg(p, fmt.Sprintf("other-%d", p), "x"))
	}
	waitFor(t, 20*time.Second, "other partitions applied", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(appliedAt) == parts // race-0 and the others
	})
	mu.Lock()
	var worst time.Duration
	for id, at := range appliedAt {
		if id != "race-0" {
			worst = max(worst, at.Sub(producedAt))
		}
	}
	mu.Unlock()
	t.Logf("other partitions applied within %v (HandlerTimeout %v + 2s grace)", worst.Round(10*time.Millisecond), cfg.HandlerTimeout)
	waitFor(t, 20*time.Second, "the hung message set aside", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE message_id = 'hang-0'`) == 1
	})
	r.stop()
	require.Less(t, worst, cfg.HandlerTimeout+5*time.Second, "the abandoned handler's gate was released when it was cut off")
}

// Promise: no partition starved; a failing message holds up its own
// partition only. One row kept locked by a forgotten session, and one
// message of partition 0 that touches it: its lock_timeout (55P03) is now
// a lost race, which closes the consumer's gate; partition 0's retries
// are then serialized, and each holds the gate for a whole LockTimeout
// while it waits for the row. Every other partition of the consumer (in
// every process) waits at the gate behind it: their latency becomes
// LockTimeout (10s by default), for as long as the session lives.
func TestAdvStuckRowLockOnOnePartitionSlowsEveryPartition(t *testing.T) {
	t.Parallel()
	const parts = 3
	e := setup(t, parts)
	hot := e.db.Table("adv_hot")
	e.db.Exec(t, `CREATE TABLE `+hot+` (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)`)
	e.db.Exec(t, `INSERT INTO `+hot+` (id) VALUES (1)`)
	holdRowLock(t, e, hot, 1)

	effect := e.applyHandler()
	var mu sync.Mutex
	appliedAt := map[string]time.Time{}
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		if string(m.Value) == "hot" {
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
	cfg.LockTimeout = 2 * time.Second
	r := e.start(cfg)
	e.kafka.Produce(t, e.topic, msg(0, "stuck-0", "hot"))
	time.Sleep(3 * time.Second) // the partition 0 message has failed at least once

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
	require.Less(t, worst, time.Second, "partitions 1 and 2 are not held up by partition 0's failing message")
}

// Promise: Run returns within ShutdownTimeout + grace after cancel, also
// when a handler that ignores its context holds the consumer's gate and
// the other partitions wait behind it.
func TestAdvShutdownWithHungGateHolderInProcess(t *testing.T) {
	t.Parallel()
	const parts = 3
	e := setup(t, parts)
	var deadlockOnce atomic.Bool
	hang := newAdvSignal()
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
	waitFor(t, 10*time.Second, "workers waiting at the gate", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`) >= 1
	})
	began := time.Now()
	r.cancel()
	select {
	case err := <-r.done:
		require.NoError(t, err)
		r.done = nil
	case <-time.After(cfg.ShutdownTimeout + 8*time.Second):
		r.done = nil
		t.Fatalf("Run did not return within ShutdownTimeout (%v) + 8s of cancel", cfg.ShutdownTimeout)
	}
	t.Logf("Run returned %v after cancel", time.Since(began))
}

// Probe: a queue-only BatchHandler (one round trip, racing) on hot rows:
// contention in the one-trip path, plan shrinking, isolate. Every transfer
// posted once, nothing dead-lettered, no attempt counted.
func TestAdvOneTripStormOnHotRows(t *testing.T) {
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

func advGateKey(schemaName, name string) int32 {
	// fnv32a(schema, 0, name), as consumer.gateKey.
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	for _, b := range append(append([]byte(schemaName), 0), name...) {
		h ^= uint32(b)
		h *= prime
	}
	return int32(h)
}

func advLetterClasses(t *testing.T, e *env) string {
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
