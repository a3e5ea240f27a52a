package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

func keyedMessages(n, keys int) []*consumer.Message {
	msgs := make([]*consumer.Message, n)
	for i := range msgs {
		msgs[i] = &consumer.Message{Topic: "t", Partition: 0, Offset: int64(i), Key: []byte("k" + strconv.Itoa(i%keys))}
	}
	return msgs
}

func TestForEachKeyKeepsEachKeyInOrderAndRunsKeysInParallel(t *testing.T) {
	msgs := keyedMessages(400, 20)
	var (
		mu      sync.Mutex
		seen    = map[string][]int64{}
		running atomic.Int32
		peak    atomic.Int32
	)
	err := consumer.ForEachKey(context.Background(), msgs, 8, func(_ context.Context, i int, m *consumer.Message) error {
		if msgs[i] != m {
			t.Errorf("fn got message %d with index %d", m.Offset, i)
		}
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Millisecond)
		running.Add(-1)
		mu.Lock()
		seen[string(m.Key)] = append(seen[string(m.Key)], m.Offset)
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	require.Len(t, seen, 20)
	for k, offs := range seen {
		require.Len(t, offs, 20, "key %s", k)
		for j := 1; j < len(offs); j++ {
			require.Less(t, offs[j-1], offs[j], "key %s handled in offset order", k)
		}
	}
	require.Greater(t, peak.Load(), int32(1), "keys ran in parallel")
	require.LessOrEqual(t, peak.Load(), int32(8), "at most the concurrency asked for")
}

func TestForEachKeyStopsAtTheFirstError(t *testing.T) {
	msgs := keyedMessages(100, 1) // one key: strictly sequential
	boom := consumer.Permanent(errors.New("bad quote"))
	var calls atomic.Int32
	err := consumer.ForEachKey(context.Background(), msgs, 4, func(_ context.Context, i int, _ *consumer.Message) error {
		calls.Add(1)
		if i == 10 {
			return boom
		}
		return nil
	})
	require.ErrorIs(t, err, boom, "the error keeps its class (Permanent)")
	require.ErrorContains(t, err, "t/0/10")
	require.EqualValues(t, 11, calls.Load(), "nothing after the failure was called")
}

func TestForEachKeyReportsMessagesSkippedBecauseTheContextEnded(t *testing.T) {
	t.Parallel()
	boom := errors.New("bad quote")
	expired, cancelExpired := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExpired()
	for _, tc := range []struct {
		name string
		// ctx makes the context ForEachKey gets; fn calls its cancel at
		// message cancelAt (-1 for never).
		ctx      func() (context.Context, context.CancelFunc)
		cancelAt int
		failAt   int // fn fails at this message; -1 for never
		keys     int
		want     error // nil: ForEachKey returns nil
		calls    int32 // -1: not checked (keys in parallel)
	}{
		{name: "cancelled before the call", ctx: cancelled, cancelAt: -1, failAt: -1, keys: 4, want: context.Canceled, calls: 0},
		{name: "deadline already passed", ctx: func() (context.Context, context.CancelFunc) { return expired, func() {} }, cancelAt: -1, failAt: -1, keys: 4, want: context.DeadlineExceeded, calls: 0},
		{name: "cancelled midway, one key", ctx: cancellable, cancelAt: 10, failAt: -1, keys: 1, want: context.Canceled, calls: 11},
		{name: "cancelled midway, many keys", ctx: cancellable, cancelAt: 10, failAt: -1, keys: 20, want: context.Canceled, calls: -1},
		{name: "cancelled at the last message", ctx: cancellable, cancelAt: 99, failAt: -1, keys: 1, want: nil, calls: 100},
		{name: "a failure before the cancel is the first error", ctx: cancellable, cancelAt: 10, failAt: 10, keys: 1, want: boom, calls: 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := tc.ctx()
			defer cancel()
			msgs := keyedMessages(100, tc.keys)
			var calls atomic.Int32
			err := consumer.ForEachKey(ctx, msgs, 4, func(_ context.Context, i int, _ *consumer.Message) error {
				calls.Add(1)
				if i == tc.cancelAt {
					cancel()
				}
				if i == tc.failAt {
					return boom
				}
				return nil
			})
			if tc.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.want)
			}
			if tc.calls >= 0 {
				require.Equal(t, tc.calls, calls.Load(), "calls of fn")
			}
			if tc.want != nil && tc.want != boom {
				require.Less(t, calls.Load(), int32(len(msgs)), "some messages were skipped")
			}
		})
	}
}

func cancelled() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx, cancel
}

func cancellable() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// fn runs on goroutines of ForEachKey's, out of reach of the recovery
// around the handler: a panic there is returned as the handler's would be,
// not a crash of the process.
func TestForEachKeyReturnsAPanicAsAnError(t *testing.T) {
	t.Parallel()
	err := consumer.ForEachKey(context.Background(), keyedMessages(10, 3), 4, func(_ context.Context, i int, _ *consumer.Message) error {
		if i == 5 {
			panic("lookup blew up")
		}
		return nil
	})
	require.ErrorIs(t, err, consumer.ErrHandlerPanicked)
	require.ErrorContains(t, err, "lookup blew up")
}
