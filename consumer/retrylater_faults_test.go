package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// TestRetryLaterDatabaseFailureDuringARetryCountsNothing: failures.md
// promises "A failure of the database during a retry counts nothing." A
// retry whose handler's statement loses a serialization race (SQLSTATE
// 40001, a failure the worker retries without counting) must leave the
// letter's retries alone, so with MaxRetries 1 the message is still
// applied once the database behaves.
func TestRetryLaterDatabaseFailureDuringARetryCountsNothing(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("d", 5)
	calls := &callCounts{}
	var dbFailing atomic.Bool
	dbFailing.Store(true)
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n := calls.add(m.ID)
		if m.ID == "d-2" {
			if n == 1 {
				return consumer.RetryLater(errors.New("partner down"), 0)
			}
			if dbFailing.Load() {
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$`)
				return err
			}
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxRetries = 1
	e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	waitFor(t, 30*time.Second, "a retry of d-2 that met the database failure", func() bool { return calls.of("d-2") >= 2 })
	dbFailing.Store(false)
	waitFor(t, 30*time.Second, "d-2 applied by a retry once the database behaves", func() bool {
		class, _, retries, redriven := e.letterOf("d-2")
		if class == "retries_exhausted" {
			t.Fatalf("the letter ran out of retries on a database failure (retries %d, %d handler calls)", retries, calls.of("d-2"))
		}
		return redriven
	})
	e.requireExactlyOnce(ids)
}

// TestRetryLaterTwoMembersRetryADueLetterAtMostMaxRetries: two members of
// one group (same Name) both poll due letters. failures.md: after
// RetryLater.MaxRetries failed retries the letter is an ordinary dead
// letter. With MaxRetries 1 the handler runs once in the partition and
// once in a retry: no member may retry a letter that is no longer due.
func TestRetryLaterTwoMembersRetryADueLetterAtMostMaxRetries(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("t", 4)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n := calls.add(m.ID)
		if m.ID == "t-1" {
			if n == 1 {
				return consumer.RetryLater(errors.New("partner down"), 0)
			}
			// A slow partner: longer than the maintenance poll, so the
			// other member's poll lists the letter meanwhile.
			select {
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
			}
			return errors.New("partner still down")
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxRetries = 1
	cfg2 := *cfg
	e.start(cfg)
	e.start(&cfg2)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	waitFor(t, 60*time.Second, "t-1 out of retries", func() bool { class, _, _, _ := e.letterOf("t-1"); return class == "retries_exhausted" })
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := calls.of("t-1"); n > 2 {
			_, _, retries, _ := e.letterOf("t-1")
			t.Fatalf("a letter out of retries was retried again: %d handler calls, retries %d (MaxRetries 1)", n, retries)
		}
	}
	_, retryAt, retries, _ := e.letterOf("t-1")
	require.Nil(t, retryAt)
	require.Equal(t, 1, retries, "retries counted past RetryLater.MaxRetries")
	require.Equal(t, 2, calls.of("t-1"), "one call in the partition, then MaxRetries retries")
	e.requireExactlyOnce(without(ids, "t-1"))
}

// TestRetryLaterNegativeDelayIsDueAtOnceAndAppliedOnce: RetryLater with a
// negative delay is due at once, and its retry applies the message once.
func TestRetryLaterNegativeDelayIsDueAtOnceAndAppliedOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("n", 5)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if calls.add(m.ID) == 1 && m.ID == "n-3" {
			return consumer.RetryLater(errors.New("partner down"), -time.Hour)
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	e.start(cfg)
	waitFor(t, 30*time.Second, "n-3 applied by its retry", func() bool { _, _, _, redriven := e.letterOf("n-3"); return redriven })
	stillFor(t, 2500*time.Millisecond, "n-3 retried after it was applied", func() bool { return calls.of("n-3") == 2 })
	e.requireExactlyOnce(ids)
}

// TestMaxAttemptsCountsHandlerCallsWithoutRetryLater: failures.md,
// Retry.MaxAttempts is "handler failures per message before it is set
// aside". Without RetryLater, a message that always fails gets exactly
// MaxAttempts handler calls, also across a restart in its retries.
func TestMaxAttemptsCountsHandlerCallsWithoutRetryLater(t *testing.T) {
	t.Parallel()
	for _, restart := range []bool{false, true} {
		name := "in one run"
		if restart {
			name = "across a restart"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			ids := e.produceIDs("m", 6)
			calls := &callCounts{}
			second := make(chan struct{})
			cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "m-2" {
					if calls.add(m.ID) == 2 {
						close(second)
					}
					return errors.New("partner down")
				}
				return e.applyHandler().Handle(ctx, tx, m)
			}))
			cfg.Retry = consumer.RetryPolicy{MaxAttempts: 3, InitialInterval: 500 * time.Millisecond, MaxInterval: 500 * time.Millisecond}
			r := e.start(cfg)
			if restart {
				<-second
				r.stop()
				e.start(cfg)
			}
			e.waitCommitted(map[int]int64{0: 6}, 60*time.Second)
			class, _, _, _ := e.letterOf("m-2")
			require.Equal(t, "retries_exhausted", class)
			require.Equal(t, 3, calls.of("m-2"), "handler calls of a message with MaxAttempts 3")
			e.requireExactlyOnce(without(ids, "m-2"))
		})
	}
}

// TestRetryLaterARetryRejectedAtCommitEndsAsAnOrdinaryLetter: failures.md,
// "after RetryLater.MaxRetries failed retries, or one failure that is
// permanent, the letter is an ordinary dead letter"; guarantee.md counts
// data Postgres rejects only at COMMIT (a deferred constraint) among the
// permanent failures. A retry whose transaction a deferred constraint
// rejects at COMMIT must end the retries, not be retried at every poll.
func TestRetryLaterARetryRejectedAtCommitEndsAsAnOrdinaryLetter(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	pairs := e.db.Table("pairs")
	e.db.Exec(t, `CREATE TABLE `+pairs+` (k int, CONSTRAINT one_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`)
	ids := e.produceIDs("c", 4)
	calls := &callCounts{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "c-1" {
			if calls.add(m.ID) == 1 {
				return consumer.RetryLater(errors.New("partner down"), 0)
			}
			// Accepted statement by statement, refused at COMMIT.
			_, err := tx.Exec(ctx, `INSERT INTO `+pairs+` VALUES (1), (1)`)
			return err
		}
		return e.applyHandler().Handle(ctx, tx, m)
	}))
	cfg.RetryLater.MaxRetries = 2
	e.start(cfg)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for {
		class, retryAt, retries, _ := e.letterOf("c-1")
		if class != "retry_later" && retryAt == nil {
			break
		}
		if n := calls.of("c-1"); time.Now().After(deadline) || n > 3 {
			t.Fatalf("a retry refused at COMMIT is retried for ever: %d handler calls (MaxRetries 2), letter still %s with retries %d, retry_at %v",
				n, class, retries, retryAt)
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.LessOrEqual(t, calls.of("c-1"), 3)
	e.requireExactlyOnce(without(ids, "c-1"))
}
