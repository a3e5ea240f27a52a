package consumer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// callCounts counts handler calls per message id.
type callCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCounts) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *callCounts) of(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// letterOf is the retry state of the dead letter of id.
func (e *env) letterOf(id string) (class string, retryAt *time.Time, retries int, redriven bool) {
	e.t.Helper()
	err := e.db.Pool.QueryRow(context.Background(), `SELECT error_class, retry_at, retries, redriven_at IS NOT NULL FROM `+e.db.Table("dead_letters")+`
WHERE consumer = $1 AND message_id = $2`, e.name, id).Scan(&class, &retryAt, &retries, &redriven)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil, 0, false
	}
	require.NoError(e.t, err)
	return class, retryAt, retries, redriven
}

func TestRetryLater(t *testing.T) {
	t.Parallel()

	t.Run("a marked failure is set aside, the partition goes on, and it is applied once when due", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("r", 20)
		var partnerDown atomic.Bool
		partnerDown.Store(true)
		calls := &callCounts{}
		cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			calls.add(m.ID)
			if m.ID == "r-3" && partnerDown.Load() {
				return consumer.RetryLater(errors.New("mail partner unavailable"), 300*time.Millisecond)
			}
			return e.applyHandler().Handle(ctx, tx, m)
		}))
		e.start(cfg)
		e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
		require.EqualValues(t, 19, e.effects(), "every message but r-3 applied: r-3 held nothing up")
		class, retryAt, _, redriven := e.letterOf("r-3")
		require.Equal(t, "retry_later", class)
		require.NotNil(t, retryAt, "set aside with the time it is due")
		require.False(t, redriven)
		waitFor(t, 30*time.Second, "a retry of r-3 that failed", func() bool { _, _, retries, _ := e.letterOf("r-3"); return retries >= 1 })

		partnerDown.Store(false)
		waitFor(t, 30*time.Second, "r-3 applied by its retry", func() bool { _, _, _, redriven := e.letterOf("r-3"); return redriven })
		e.requireExactlyOnce(ids)
		_, retryAt, _, _ = e.letterOf("r-3")
		require.Nil(t, retryAt, "a letter redriven is due no more")
		require.EqualValues(t, 20, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1")+` AND status = 'applied'`, e.name))
	})

	t.Run("under the policy a failure that could pass is not retried in place, and runs out into an ordinary letter", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("p", 10)
		calls := &callCounts{}
		cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			calls.add(m.ID)
			if m.ID == "p-1" {
				return errors.New("partner down for good")
			}
			return e.applyHandler().Handle(ctx, tx, m)
		}))
		cfg.RetryLater = consumer.RetryLaterPolicy{After: 100 * time.Millisecond, MaxRetries: 3, MaxDelay: 200 * time.Millisecond}
		cfg.Retry.MaxAttempts = 10
		e.start(cfg)
		e.waitCommitted(map[int]int64{0: 10}, 30*time.Second)
		waitFor(t, 60*time.Second, "p-1 out of retries", func() bool { class, _, _, _ := e.letterOf("p-1"); return class == "retries_exhausted" })
		class, retryAt, retries, redriven := e.letterOf("p-1")
		require.Equal(t, "retries_exhausted", class)
		require.Nil(t, retryAt, "an ordinary dead letter is due no more")
		require.Equal(t, 3, retries)
		require.False(t, redriven)
		stillFor(t, 2500*time.Millisecond, "a letter out of retries was retried again", func() bool { return calls.of("p-1") == 4 })
		require.Equal(t, 4, calls.of("p-1"), "one call in the partition, then MaxRetries retries: none in place")
		e.requireExactlyOnce(without(ids, "p-1"))
	})

	t.Run("a policy that cannot set messages aside is refused", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		cfg := e.config(e.applyHandler())
		cfg.OnPermanentFailure = consumer.StopPartition
		cfg.RetryLater.After = time.Minute
		_, err := consumer.New(e.db.Pool, cfg)
		require.ErrorContains(t, err, "RetryLater.After sets failing messages aside, and OnPermanentFailure StopPartition stops the partition instead")
	})
}

func without(ids []string, drop string) []string {
	var out []string
	for _, id := range ids {
		if id != drop {
			out = append(out, id)
		}
	}
	return out
}
