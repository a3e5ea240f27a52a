package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// A downstream system that is down makes every message fail: the breaker
// pauses the topic after Failures failed attempts, as an operator's pause
// would (stored, with its reason), tries again when the pause ends, pauses
// for twice as long when the probe fails, and once the system is back the
// messages are applied, each once and in order: none was set aside or
// skipped.
func TestCircuitBreakerPausesAFailingTopic(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	var appliedOffsets []int64
	var s *pauseSetup
	s = newPauseSetup(t, 1, 10, consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if down.Load() {
			return errors.New("ledger service unavailable")
		}
		if err := s.applyHandler().Handle(ctx, tx, m); err != nil {
			return err
		}
		mu.Lock()
		appliedOffsets = append(appliedOffsets, m.Offset)
		mu.Unlock()
		return nil
	}), func(cfg *consumer.Config) {
		cfg.Retry = consumer.RetryPolicy{InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: time.Hour}
		cfg.CircuitBreaker = consumer.CircuitBreaker{Failures: 3, Window: time.Minute, CoolDown: time.Second, MaxCoolDown: 2 * time.Second}
	})
	s.run()

	paused := func(n int) consumer.PartitionPaused {
		t.Helper()
		var r consumer.PartitionPaused
		waitFor(t, 30*time.Second, "the breaker's pause", func() bool {
			s.watch.mu.Lock()
			defer s.watch.mu.Unlock()
			var seen []consumer.PartitionPaused
			for _, p := range s.watch.reports {
				if !p.Resumed && !slices.ContainsFunc(seen, func(q consumer.PartitionPaused) bool { return q.Since.Equal(p.Since) }) {
					seen = append(seen, p)
				}
			}
			if len(seen) < n {
				return false
			}
			r = seen[n-1]
			return true
		})
		return r
	}
	first := paused(1)
	require.True(t, strings.HasPrefix(first.By, "circuit breaker of "+s.name+" on "), first.By)
	require.Contains(t, first.Reason, "3 failures in 1m0s")
	require.Contains(t, first.Reason, "ledger service unavailable")
	require.Equal(t, "topic "+s.topic, first.Scope)
	require.InDelta(t, 1, first.Until.Sub(first.Since).Seconds(), 0.1, "paused for CoolDown")

	second := paused(2)
	require.Contains(t, second.Reason, "the probe after the last pause failed")
	require.InDelta(t, 2, second.Until.Sub(second.Since).Seconds(), 0.1, "paused twice as long after a failed probe")
	third := paused(3)
	require.InDelta(t, 2, third.Until.Sub(third.Since).Seconds(), 0.1, "no longer than MaxCoolDown")

	down.Store(false)
	s.waitCommitted(map[int]int64{0: 10}, time.Minute)
	mu.Lock()
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, appliedOffsets, "applied once each, in order")
	mu.Unlock()
	require.Zero(t, s.db.Int(t, `SELECT count(*) FROM `+s.db.Table("dead_letters")), "nothing set aside")
	s.check(expectation{ids: s.ids})

	store, err := pauses.NewStore(s.db.Schema)
	require.NoError(t, err)
	list, err := store.List(context.Background(), s.db.Pool, s.name)
	require.NoError(t, err)
	require.Empty(t, list, "the last pause ended by itself")
}
