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
	"github.com/kafkaonce/kafkaonce/pauses"
)

// pauseWatch records the HookPartitionPaused reports.
type pauseWatch struct {
	mu      sync.Mutex
	reports []consumer.PartitionPaused
}

func (p *pauseWatch) OnPartitionPaused(_ context.Context, r consumer.PartitionPaused) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reports = append(p.reports, r)
}

// last is the last report for partition, and whether there is one.
func (p *pauseWatch) last(partition int) (consumer.PartitionPaused, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.reports) - 1; i >= 0; i-- {
		if p.reports[i].Partition == partition {
			return p.reports[i], true
		}
	}
	return consumer.PartitionPaused{}, false
}

func (p *pauseWatch) paused(partition int) bool {
	r, ok := p.last(partition)
	return ok && !r.Resumed
}

// pauseSetup is a consumer over a topic with messages on every partition,
// with its pause reports watched.
type pauseSetup struct {
	*env
	ids     []string
	watch   *pauseWatch
	cfg     *consumer.Config
	c       *consumer.Consumer
	perPart int64
}

// newPauseSetup builds the consumer from the env's config, with each
// configure applied to it first.
func newPauseSetup(t *testing.T, partitions, messages int, h consumer.Handler, configure ...func(*consumer.Config)) *pauseSetup {
	e := setup(t, partitions)
	s := &pauseSetup{env: e, watch: &pauseWatch{}, perPart: int64(messages / partitions)}
	s.ids = e.produceIDs("p", messages)
	if h == nil {
		h = e.applyHandler()
	}
	s.cfg = e.config(h)
	s.cfg.Hooks = append(s.cfg.Hooks, s.watch)
	for _, f := range configure {
		f(s.cfg)
	}
	var err error
	s.c, err = consumer.New(e.db.Pool, s.cfg)
	require.NoError(t, err)
	return s
}

// run runs s.c until the test ends (or the returned stop).
func (s *pauseSetup) run() *running { return s.env.run(s.c) }

func (s *pauseSetup) effectsOf(partition int) int64 {
	return s.db.Int(s.t, `SELECT count(*) FROM `+s.db.Table("effects")+` WHERE partition = $1`, partition)
}

func TestPause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("a paused partition fetches nothing and holds nothing, then resumes where it stopped", func(t *testing.T) {
		t.Parallel()
		s := newPauseSetup(t, 2, 400, nil)
		require.NoError(t, s.c.Pause(ctx, pauses.Partition(s.topic, 0), "inspecting partition 0"), "a pause needs no running consumer")
		s.run()
		s.waitCommitted(map[int]int64{1: s.perPart}, 60*time.Second)
		waitFor(t, 10*time.Second, "partition 0 reported paused", func() bool { return s.watch.paused(0) })
		r, _ := s.watch.last(0)
		require.Equal(t, "inspecting partition 0", r.Reason)
		require.Equal(t, s.topic+"/0", r.Scope)
		require.Contains(t, r.By, "Consumer.Pause on ")
		// The member's pause and maintenance reads are short transactions
		// of their own; a paused partition's would last.
		stillFor(t, time.Second, "partition 0 applied nothing while paused", func() bool { return s.effectsOf(0) == 0 })
		stillFor(t, time.Second, "a session held a transaction or waited on a statement while partition 0 was paused", func() bool {
			return s.db.SessionsStuck(t, "idle in transaction%", 500*time.Millisecond) == 0 && s.db.SessionsStuck(t, "active", 500*time.Millisecond) == 0
		})
		_, reported := s.watch.last(1)
		require.False(t, reported, "partition 1 reported paused")

		require.NoError(t, s.c.Resume(ctx, pauses.Partition(s.topic, 0)))
		s.waitCommitted(map[int]int64{0: s.perPart, 1: s.perPart}, 60*time.Second)
		r, _ = s.watch.last(0)
		require.True(t, r.Resumed)
		s.check(expectation{ids: s.ids})
	})

	t.Run("a pause written by another process stops the partition mid-run", func(t *testing.T) {
		t.Parallel()
		var applied atomic.Int64
		var s *pauseSetup
		s = newPauseSetup(t, 1, 2000, consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			applied.Add(1)
			time.Sleep(time.Millisecond)
			return s.applyHandler().Handle(ctx, tx, m)
		}), func(cfg *consumer.Config) { cfg.MaxBatch = 20 })
		s.run()
		waitFor(t, 60*time.Second, "some progress", func() bool { return s.effectsOf(0) >= 100 })
		store, err := pauses.NewStore(s.db.Schema)
		require.NoError(t, err)
		_, err = store.Pause(ctx, s.db.Pool, s.name, pauses.Topic(s.topic), "kafkaonce pause by ops@host", "deploy on hold")
		require.NoError(t, err)
		waitFor(t, 10*time.Second, "the member to see the pause", func() bool { return s.watch.paused(0) })
		at := s.effectsOf(0)
		require.Less(t, at, int64(2000), "the partition drained before the pause")
		calls := applied.Load()
		stillFor(t, 1500*time.Millisecond, "the handler ran after the partition was reported paused", func() bool {
			return applied.Load() == calls && s.effectsOf(0) == at
		})
		_, err = store.Resume(ctx, s.db.Pool, s.name, pauses.Topic(s.topic))
		require.NoError(t, err)
		s.waitCommitted(map[int]int64{0: 2000}, 90*time.Second)
		s.check(expectation{ids: s.ids})
	})

	t.Run("a pause cuts a failing message's retries short and holds across a restart", func(t *testing.T) {
		t.Parallel()
		var failing atomic.Bool
		failing.Store(true)
		var calls atomic.Int64
		var s *pauseSetup
		handler := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			calls.Add(1)
			if failing.Load() {
				return errors.New("partner down")
			}
			return s.applyHandler().Handle(ctx, tx, m)
		})
		retryLong := func(cfg *consumer.Config) {
			cfg.Retry = consumer.RetryPolicy{InitialInterval: 20 * time.Millisecond, MaxInterval: 100 * time.Millisecond, MaxAttempts: 1000, MaxElapsed: time.Hour}
		}
		s = newPauseSetup(t, 1, 50, handler, retryLong)
		r := s.run()
		waitFor(t, 30*time.Second, "the handler to fail a few times", func() bool { return calls.Load() >= 3 })
		require.NoError(t, s.c.Pause(ctx, pauses.All(), "partner down"))
		waitFor(t, 10*time.Second, "the partition reported paused", func() bool { return s.watch.paused(0) })
		n := calls.Load()
		stillFor(t, time.Second, "the handler was retried while the partition was paused", func() bool { return calls.Load() == n })

		r.stop() // Run returns promptly while paused (stop fails the test after 30 s)

		watch := &pauseWatch{}
		cfg := s.config(handler)
		retryLong(cfg)
		cfg.Hooks = append(cfg.Hooks, watch)
		again, err := consumer.New(s.db.Pool, cfg)
		require.NoError(t, err)
		s.c = again
		s.run()
		waitFor(t, 30*time.Second, "the partition reported paused at its assignment after the restart", func() bool { return watch.paused(0) })
		stillFor(t, time.Second, "the restarted consumer ran the handler on a paused partition", func() bool { return calls.Load() == n })

		failing.Store(false)
		require.NoError(t, again.Resume(ctx, pauses.All()))
		s.waitCommitted(map[int]int64{0: 50}, 60*time.Second)
		s.check(expectation{ids: s.ids})
	})

	t.Run("a pause for a time ends by itself, by the database's clock", func(t *testing.T) {
		t.Parallel()
		// Each batch of partition 0 notes when its transaction began, by
		// the server's clock: none may begin before the pause's end.
		var mu sync.Mutex
		var firstBatch time.Time
		var s *pauseSetup
		s = newPauseSetup(t, 2, 200, consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.Partition == 0 {
				var began time.Time
				if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&began); err != nil {
					return err
				}
				mu.Lock()
				if firstBatch.IsZero() || began.Before(firstBatch) {
					firstBatch = began
				}
				mu.Unlock()
			}
			return s.applyHandler().Handle(ctx, tx, m)
		}))
		require.ErrorContains(t, s.c.PauseFor(ctx, pauses.Partition(s.topic, 0), 0, "no time"), "use Pause for a pause until resumed")
		require.NoError(t, s.c.PauseFor(ctx, pauses.Partition(s.topic, 0), 5*time.Second, "a short window"))
		s.run()
		waitFor(t, 10*time.Second, "partition 0 reported paused", func() bool { return s.watch.paused(0) })
		r, _ := s.watch.last(0)
		require.False(t, r.Until.IsZero(), "the report names the pause's end")
		require.InDelta(t, (5 * time.Second).Seconds(), r.Until.Sub(r.Since).Seconds(), 0.1)

		s.waitCommitted(map[int]int64{0: s.perPart, 1: s.perPart}, 60*time.Second)
		last, _ := s.watch.last(0)
		require.True(t, last.Resumed, "the partition was reported resumed")
		mu.Lock()
		defer mu.Unlock()
		require.False(t, firstBatch.Before(r.Until), "partition 0's first batch began at %s, before the pause ended at %s", firstBatch, r.Until)
		store, _ := pauses.NewStore(s.db.Schema)
		list, err := store.List(ctx, s.db.Pool, s.name)
		require.NoError(t, err)
		require.Empty(t, list, "an ended pause is not listed")
		s.check(expectation{ids: s.ids})
	})

	t.Run("a topic the consumer does not read is refused", func(t *testing.T) {
		t.Parallel()
		s := newPauseSetup(t, 1, 1, nil)
		err := s.c.Pause(ctx, pauses.Topic("not-"+s.topic), "typo")
		require.ErrorContains(t, err, "is not one of the consumer's Topics")
		err = s.c.Resume(ctx, pauses.Partition("not-"+s.topic, 0))
		require.ErrorContains(t, err, "is not one of the consumer's Topics")
		store, _ := pauses.NewStore(s.db.Schema)
		list, err := store.List(ctx, s.db.Pool, s.name)
		require.NoError(t, err)
		require.Empty(t, list)
	})
}
