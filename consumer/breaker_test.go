package consumer_test

import (
	"context"
	"errors"
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
		// Pauses of seconds: each is reported before it ends, on a loaded
		// machine too.
		cfg.CircuitBreaker = consumer.CircuitBreaker{Failures: 3, Window: time.Minute, CoolDown: 2 * time.Second, MaxCoolDown: 4 * time.Second}
	})
	s.run()

	paused := func(n int) consumer.PartitionPaused {
		t.Helper()
		waitFor(t, 30*time.Second, "the breaker's pause", func() bool { return len(s.watch.breakerPauses()) >= n })
		return s.watch.breakerPauses()[n-1]
	}
	first := paused(1)
	require.True(t, strings.HasPrefix(first.By, "circuit breaker of "+s.name+" on "), first.By)
	require.Contains(t, first.Reason, "3 failures in 1m0s")
	require.Contains(t, first.Reason, "ledger service unavailable")
	require.Equal(t, "topic "+s.topic, first.Scope)
	require.InDelta(t, 2, first.Until.Sub(first.Since).Seconds(), 0.1, "paused for CoolDown")

	second := paused(2)
	require.Contains(t, second.Reason, "the probe after the last pause failed")
	require.InDelta(t, 4, second.Until.Sub(second.Since).Seconds(), 0.1, "paused twice as long after a failed probe")
	third := paused(3)
	require.InDelta(t, 4, third.Until.Sub(third.Since).Seconds(), 0.1, "no longer than MaxCoolDown")

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

// breakerPauses are the distinct pauses reported, in order (a pause is
// reported by every partition it covers: one per Since).
func (p *pauseWatch) breakerPauses() []consumer.PartitionPaused {
	p.mu.Lock()
	defer p.mu.Unlock()
	var seen []consumer.PartitionPaused
outer:
	for _, r := range p.reports {
		if r.Resumed {
			continue
		}
		for _, q := range seen {
			if q.Since.Equal(r.Since) {
				continue outer
			}
		}
		seen = append(seen, r)
	}
	return seen
}

// An operator lifts the breaker's pause early with kafkaonce resume (the
// service is back), and messages are applied: per docs/failures.md a
// message applied closes the breaker, and the breaker trips only after
// Failures failed attempts within Window. One later failure (Failures is
// 3) must not pause the topic again.
func TestCircuitBreakerResumedEarlyThenAppliedIsClosed(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	var failAt atomic.Int64 // the time (unix nanos) offset 20 fails once, then succeeds
	var failedOnce atomic.Bool
	var s *pauseSetup
	s = newPauseSetup(t, 1, 30, consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if down.Load() {
			return errors.New("ledger service unavailable")
		}
		if m.Offset == 20 && !failedOnce.Load() {
			if d := time.Until(time.Unix(0, failAt.Load())); d > 0 {
				time.Sleep(d)
			}
			failedOnce.Store(true)
			return errors.New("one blip")
		}
		return s.applyHandler().Handle(ctx, tx, m)
	}), func(cfg *consumer.Config) {
		cfg.Retry = consumer.RetryPolicy{InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: time.Hour}
		// A cool-down well past the consumer's poll of its pauses (each second): the
		// resume is seen before the breaker's pause would have ended.
		cfg.CircuitBreaker = consumer.CircuitBreaker{Failures: 3, Window: time.Minute, CoolDown: 5 * time.Second, MaxCoolDown: 20 * time.Second}
	})
	var first consumer.PartitionPaused
	s.run()
	waitFor(t, 30*time.Second, "the breaker's first pause", func() bool {
		ps := s.watch.breakerPauses()
		if len(ps) == 0 {
			return false
		}
		first = ps[0]
		return true
	})
	// Offset 20 fails once, well after the breaker's pause would have ended.
	failAt.Store(first.Until.Add(time.Second).UnixNano())
	down.Store(false)
	store, err := pauses.NewStore(s.db.Schema)
	require.NoError(t, err)
	resumed, err := store.Resume(context.Background(), s.db.Pool, s.name, pauses.Topic(s.topic)) // kafkaonce resume
	require.NoError(t, err)
	require.True(t, resumed)

	s.waitCommitted(map[int]int64{0: 30}, time.Minute)
	require.True(t, failedOnce.Load())
	s.check(expectation{ids: s.ids})
	ps := s.watch.breakerPauses()
	for _, p := range ps[1:] {
		t.Logf("another pause: by %q, reason %q, for %s", p.By, p.Reason, p.Until.Sub(p.Since))
	}
	require.Len(t, ps, 1, "messages applied after the early resume closed the breaker: one failure of 3 does not pause the topic")
}

// The breaker trips (Failures 3) before a message runs out of its
// attempts (MaxAttempts 5), and the service stays down for a few pauses.
// docs/failures.md: "A pause drops and reorders nothing: the message
// being retried in place stops waiting and is tried again when the pause
// ends, in its place"; kafkaoncetype.CircuitBreaker: "A breaker never
// sets a message aside nor skips one". Once the service is back every
// message must be applied, none set aside.
func TestCircuitBreakerProbesDoNotSpendTheMessagesAttempts(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	var s *pauseSetup
	s = newPauseSetup(t, 1, 10, consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if down.Load() {
			return errors.New("ledger service unavailable")
		}
		return s.applyHandler().Handle(ctx, tx, m)
	}), func(cfg *consumer.Config) {
		cfg.Retry = consumer.RetryPolicy{InitialInterval: 20 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxAttempts: 5, MaxElapsed: time.Hour}
		cfg.CircuitBreaker = consumer.CircuitBreaker{Failures: 3, Window: time.Minute, CoolDown: time.Second, MaxCoolDown: time.Second}
	})
	s.run()
	waitFor(t, 30*time.Second, "the breaker's third pause", func() bool { return len(s.watch.breakerPauses()) >= 3 })
	down.Store(false)
	s.waitCommitted(map[int]int64{0: 10}, time.Minute)
	letters := s.db.Int(t, `SELECT count(*) FROM `+s.db.Table("dead_letters"))
	require.Zero(t, letters, "the breaker's probes spent the attempts of the message it held, and it was set aside while the topic was paused for it")
	s.check(expectation{ids: s.ids})
}
