package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// Settings take effect end to end: the engine holds the Config whole (no
// field is copied on the way), and each subtest sets one setting (or a
// group) away from its default and watches the consumer behave by it.
func TestSettingsTakeEffect(t *testing.T) {
	t.Parallel()

	t.Run("session timeouts", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("s", 1) // one message: its transaction does not race, so lock_timeout is LockTimeout's
		var got [3]string
		var once sync.Once
		cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var st, lt, it string
			if err := tx.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')`).Scan(&st, &lt, &it); err != nil {
				return err
			}
			once.Do(func() { got = [3]string{st, lt, it} })
			return e.applyHandler().Handle(ctx, tx, m)
		}))
		cfg.StatementTimeout, cfg.LockTimeout, cfg.IdleInTransactionTimeout = 7*time.Second, 3*time.Second, 9*time.Second
		cfg.HandlerTimeout = 5 * time.Second
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
		r.stop()
		require.Equal(t, [3]string{"7s", "3s", "9s"}, got, "statement, lock and idle-in-transaction timeouts")
	})

	t.Run("Retry.MaxAttempts", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("m", 1)
		var calls atomic.Int32
		cfg := e.config(consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
			calls.Add(1)
			return errors.New("partner down")
		}))
		cfg.Retry.MaxAttempts = 3
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
		r.stop()
		l := e.letters()["m-0"]
		require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
		require.Equal(t, 3, l.Attempts)
		require.EqualValues(t, 3, calls.Load(), "the handler ran MaxAttempts times")
	})

	t.Run("Retry.MaxElapsed and intervals", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("m", 1)
		var calls atomic.Int32
		cfg := e.config(consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
			calls.Add(1)
			return errors.New("partner down")
		}))
		cfg.Retry = consumer.RetryPolicy{MaxAttempts: 1000, InitialInterval: 20 * time.Millisecond, MaxInterval: 40 * time.Millisecond, MaxElapsed: 400 * time.Millisecond}
		began := time.Now()
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
		took := time.Since(began)
		r.stop()
		l := e.letters()["m-0"]
		require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
		require.Less(t, l.Attempts, 1000, "MaxElapsed ended the retries")
		require.GreaterOrEqual(t, l.Attempts, 2)
		require.Less(t, took, 15*time.Second, "waits bounded by MaxInterval (40ms), not the default 5s")
		require.GreaterOrEqual(t, l.LastFailedAt.Sub(l.FirstFailedAt), 300*time.Millisecond, "retried for about MaxElapsed")
	})

	t.Run("Retry intervals", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("m", 1)
		cfg := e.config(consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
			return errors.New("partner down")
		}))
		// 8 waits, each uniform in [0, 150ms]: their sum is below 200ms
		// with a probability of about 2e-4, and above 1.2s never.
		cfg.Retry = consumer.RetryPolicy{MaxAttempts: 9, InitialInterval: 150 * time.Millisecond, MaxInterval: 150 * time.Millisecond}
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
		r.stop()
		l := e.letters()["m-0"]
		require.Equal(t, 9, l.Attempts)
		spent := l.LastFailedAt.Sub(l.FirstFailedAt)
		require.GreaterOrEqual(t, spent, 200*time.Millisecond, "the retries waited (InitialInterval, MaxInterval)")
		require.Less(t, spent, 5*time.Second, "no wait longer than MaxInterval")
	})

	t.Run("HandlerTimeout", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("m", 1)
		cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			<-ctx.Done()
			return ctx.Err()
		}))
		cfg.HandlerTimeout = 150 * time.Millisecond
		cfg.Retry.MaxAttempts = 1
		tp := withTap(cfg)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
		r.stop()
		f := tp.snap().failedFor(0)
		require.NotEmpty(t, f)
		require.ErrorIs(t, f[0].f.Err, consumer.ErrHandlerTimeout)
		require.Contains(t, e.letters()["m-0"].Error, "150ms")
	})

	t.Run("MaxBatch", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("m", 30)
		cfg := e.config(e.applyHandler())
		cfg.MaxBatch = 7
		tp := withTap(cfg)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 30}, 30*time.Second)
		r.stop()
		e.requireExactlyOnce(ids)
		for _, b := range tp.snap().starts {
			require.LessOrEqual(t, b.Size, 7)
			require.Equal(t, 7, b.BatchLimit)
		}
	})

	t.Run("StartOffset", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("old", 3)
		cfg := e.config(e.applyHandler())
		cfg.StartOffset = consumer.StartLatest
		tp := withTap(cfg)
		r := e.start(cfg)
		waitFor(t, 30*time.Second, "the assignment", func() bool { return len(tp.snap().assigned) > 0 })
		ids := e.produceIDs("new", 3)
		e.waitCommitted(map[int]int64{0: 6}, 30*time.Second)
		r.stop()
		e.requireExactlyOnce(ids)
		require.EqualValues(t, 3, tp.snap().assigned[0].Start)
	})

	t.Run("SuspectDuplicates", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.kafka.Produce(t, e.topic,
			kafka.Message{Key: []byte("k"), Value: []byte("same"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("one")}}},
			kafka.Message{Key: []byte("k"), Value: []byte("same"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("two")}}})
		cfg := e.config(e.applyHandler())
		cfg.SuspectDuplicates = consumer.SkipSuspects
		tp := withTap(cfg)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 2}, 30*time.Second)
		r.stop()
		e.requireExactlyOnce([]string{"one"})
		s := tp.snap()
		require.Len(t, s.skipped, 1)
		require.Equal(t, consumer.SkipSuspectDuplicate, s.skipped[0].reason)
		require.Len(t, s.suspects, 1)
		require.Equal(t, consumer.SuspectOf{MessageID: "one", Offset: 0, At: s.suspects[0].first.At}, s.suspects[0].first)
	})

	t.Run("SuspectDuplicateWindow", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.kafka.Produce(t, e.topic,
			kafka.Message{Key: []byte("k"), Value: []byte("same"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("one")}}},
			kafka.Message{Key: []byte("k"), Value: []byte("same"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("two")}}})
		cfg := e.config(e.applyHandler())
		cfg.SuspectDuplicates = consumer.SkipSuspects
		cfg.SuspectDuplicateWindow = consumer.LeaveUnset
		tp := withTap(cfg)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 2}, 30*time.Second)
		r.stop()
		e.requireExactlyOnce([]string{"one", "two"})
		require.Empty(t, tp.snap().suspects)
	})

	t.Run("Prune", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("p", 3)
		cfg := e.config(e.applyHandler())
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
		r.stop()
		age := func(id string, d time.Duration) {
			e.db.Exec(t, `UPDATE `+e.db.Table("processed_messages")+` SET processed_at = now() - $2::interval WHERE `+e.db.ConsumerIs("$1")+` AND message_id = $3`,
				e.name, d.String(), id)
		}
		age("p-0", 50*time.Hour)
		age("p-1", 30*time.Hour)
		claimed := func(id string) bool {
			return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1")+` AND message_id = $2`, e.name, id) == 1
		}
		cfg.Prune = consumer.Pruning{Interval: time.Hour, Retention: 40 * time.Hour, Batch: 1}
		r = e.start(cfg)
		waitFor(t, 20*time.Second, "the claim older than Retention pruned", func() bool { return !claimed("p-0") })
		r.stop()
		require.True(t, claimed("p-1"), "a claim younger than Retention stays")
		require.True(t, claimed("p-2"))
	})

	t.Run("ShutdownTimeout", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("m", 1)
		in := make(chan struct{}, 1)
		cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			select {
			case in <- struct{}{}:
			default:
			}
			<-ctx.Done() // the batch in flight may run until ShutdownTimeout
			return ctx.Err()
		}))
		cfg.ShutdownTimeout = 1500 * time.Millisecond
		r := e.start(cfg)
		select {
		case <-in:
		case <-time.After(30 * time.Second):
			t.Fatal("the handler never ran")
		}
		began := time.Now()
		r.stop()
		took := time.Since(began)
		require.GreaterOrEqual(t, took, 1200*time.Millisecond, "the batch in flight had ShutdownTimeout to finish")
		require.Less(t, took, 7*time.Second, "ShutdownTimeout (1.5s), not the default 10s")
		require.Zero(t, e.effects())
	})

	t.Run("Logger", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("m", 1)
		var buf syncBuffer
		cfg := e.config(e.applyHandler())
		cfg.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
		r.stop()
		out := buf.String()
		require.Contains(t, out, "consumer="+e.name)
		require.Contains(t, out, "partition assigned")
	})

	t.Run("ClaimFirst", func(t *testing.T) {
		t.Parallel()
		bothWays(t, batchPaths, func(t *testing.T, claimFirst bool) {
			e := setup(t, 1)
			ids := e.produceIDs("c", 5)
			var txRefused atomic.Int32
			var mu sync.Mutex
			seen := map[string]int{}
			apply := e.queueEffects()
			cfg := e.config(nil)
			cfg.Handler = nil
			cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
				mu.Lock()
				for _, m := range b.Messages {
					seen[m.ID]++
				}
				mu.Unlock()
				if _, err := b.Tx.Exec(ctx, "SELECT 1"); err != nil {
					txRefused.Add(1)
					return err
				}
				return apply.HandleBatch(ctx, b)
			})
			cfg.ClaimFirst = claimFirst
			r := e.start(cfg)
			e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
			// Re-sends of committed ids: claiming first, the handler never
			// sees them.
			e.kafka.Produce(t, e.topic, msg(0, "c-1", "v-c-1"), msg(0, "c-3", "v-c-3"), msg(0, "c-9", "v-c-9"))
			e.waitCommitted(map[int]int64{0: 8}, 30*time.Second)
			r.stop()
			e.requireExactlyOnce(append(ids, "c-9"))
			if claimFirst {
				require.Zero(t, txRefused.Load(), "with ClaimFirst the transaction is open in every call")
				for id, n := range seen {
					require.Equalf(t, 1, n, "with ClaimFirst the handler sees %s once", id)
				}
			} else {
				require.Positive(t, txRefused.Load(), "a one-trip attempt calls the handler before the transaction is open")
			}
		})
	})
}
