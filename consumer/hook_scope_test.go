package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// scopeKey marks a context a scope hook made.
type scopeKey struct{}

// scopes implements the scope hooks and the hooks that should run inside
// them, and checks that each sees the context its scope made: what a
// tracing hook relies on to find its span.
type scopes struct {
	mu       sync.Mutex
	open     map[int]bool // batch scopes open, by number
	n        int
	outside  []string // hooks called without a batch scope's context, or after its end
	ended    []error  // handler scope ends, with the call's error
	sizes    []int    // the messages each batch scope was given
	maxOpen  int
	endsSeen int
}

func (s *scopes) ScopeBatch(ctx context.Context, b consumer.BatchInfo, msgs []*consumer.Message) (context.Context, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n++
	n := s.n
	if s.open == nil {
		s.open = map[int]bool{}
	}
	s.open[n] = true
	s.maxOpen = max(s.maxOpen, len(s.open))
	s.sizes = append(s.sizes, len(msgs))
	if len(msgs) != b.Size || msgs[0].Offset != b.FirstOffset || msgs[len(msgs)-1].Offset != b.LastOffset {
		s.outside = append(s.outside, "ScopeBatch: msgs do not match BatchInfo")
	}
	return context.WithValue(ctx, scopeKey{}, n), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.open, n)
		s.endsSeen++
	}
}

type handlerScopeKey struct{}

func (s *scopes) ScopeHandler(ctx context.Context, m *consumer.Message) (context.Context, func(error)) {
	id := m.ID
	return context.WithValue(ctx, handlerScopeKey{}, id), func(err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.ended = append(s.ended, err)
	}
}

// in records a hook called outside an open batch scope.
func (s *scopes) in(ctx context.Context, hook string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := ctx.Value(scopeKey{}).(int)
	if !ok || !s.open[n] {
		s.outside = append(s.outside, hook)
	}
}

func (s *scopes) OnBatchStart(ctx context.Context, _ consumer.BatchInfo) { s.in(ctx, "OnBatchStart") }
func (s *scopes) OnBatchEnd(ctx context.Context, _ consumer.BatchInfo, _ consumer.BatchResult) {
	s.in(ctx, "OnBatchEnd")
}
func (s *scopes) OnMessageApplied(ctx context.Context, _ *consumer.Message) {
	s.in(ctx, "OnMessageApplied")
}
func (s *scopes) OnMessageSkipped(ctx context.Context, _ *consumer.Message, _ consumer.SkipReason) {
	s.in(ctx, "OnMessageSkipped")
}
func (s *scopes) OnMessageDeadLettered(ctx context.Context, _ *consumer.Message, _ consumer.DeadLettered) {
	s.in(ctx, "OnMessageDeadLettered")
}

func TestScopeHooksWrapTheBatchAndTheHandler(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	// a, b, a again (skipped), poison (set aside in a savepoint), c.
	e.kafka.Produce(t, e.topic, msg(0, "a", "1"), msg(0, "b", "2"), msg(0, "a", "1"), msg(0, "poison", "3"), msg(0, "c", "4"))
	s := &scopes{}
	apply := e.applyHandler()
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n, batchOK := ctx.Value(scopeKey{}).(int)
		id, _ := ctx.Value(handlerScopeKey{}).(string)
		s.mu.Lock()
		open := s.open[n]
		s.mu.Unlock()
		if !batchOK || !open || id != m.ID {
			return consumer.Permanent(errors.New("the handler's context lacks its scopes"))
		}
		if m.ID == "poison" {
			return consumer.Permanent(errors.New("poison"))
		}
		return apply.Handle(ctx, tx, m)
	}))
	cfg.Hooks = append(cfg.Hooks, s)
	r := e.start(cfg)
	e.waitEffects(3, 30*time.Second)
	waitFor(t, 10*time.Second, "the dead letter", func() bool { return len(e.letters()) == 1 })
	r.stop()

	s.mu.Lock()
	defer s.mu.Unlock()
	require.Empty(t, s.outside, "hooks called outside their batch's scope")
	require.Empty(t, s.open, "every batch scope ended")
	require.Equal(t, s.n, s.endsSeen)
	require.Equal(t, 1, s.maxOpen, "one partition: one transaction at a time")
	var failed int
	for _, err := range s.ended {
		if err != nil {
			failed++
			require.ErrorContains(t, err, "poison", "the handler scope ends with the call's error")
		}
	}
	require.GreaterOrEqual(t, failed, 1)
	require.GreaterOrEqual(t, len(s.ended), 4, "a handler scope per call: a, b, poison, c")
	require.Len(t, e.letters(), 1)
}
