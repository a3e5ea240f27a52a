package consumer

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// ForEachKey calls fn for every message of msgs, up to concurrency keys at
// a time: messages with the same key are handled one after another in the
// order of msgs (offset order within a partition), messages with different
// keys in parallel. It returns when all calls have returned; if any failed,
// the others not yet started are skipped and the first error is returned,
// naming its message. If ctx ends first, the messages not yet started are
// skipped and, unless a call failed, an error wrapping ctx.Err() is
// returned: ForEachKey returns nil only when fn returned nil for every
// message. A panic in fn is such a failure, an error wrapping
// ErrHandlerPanicked, as in the handler itself.
//
// It is for a BatchHandler whose per-message work is slow and need not be
// serial across keys — a computation, a lookup in a read-only service —
// before the batch's writes:
//
//	results := make([]Rate, len(b.Messages))
//	err := consumer.ForEachKey(ctx, b.Messages, 32, func(ctx context.Context, i int, m *consumer.Message) error {
//		r, err := quote(ctx, m) // slow, no effects outside
//		results[i] = r
//		return err
//	})
//	// then queue the writes for results with b.Queue
//
// fn must not use the batch's transaction: a Postgres connection runs one
// statement at a time. Ordering and durability are unchanged, since the
// batch still commits as a whole: its position advances, and its offset is
// committed, only after every message of it is applied.
func ForEachKey(ctx context.Context, msgs []*Message, concurrency int, fn func(ctx context.Context, i int, m *Message) error) error {
	if concurrency < 1 {
		concurrency = 1
	}
	// Group the indexes by key, keeping first-seen order of keys.
	lanes := map[string][]int{}
	var order []string
	for i, m := range msgs {
		k := string(m.Key)
		if _, ok := lanes[k]; !ok {
			order = append(order, k)
		}
		lanes[k] = append(lanes[k], i)
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
		handled  atomic.Int64
		next     = make(chan []int)
	)
	for range min(concurrency, len(order)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lane := range next {
				for _, i := range lane {
					if ctx.Err() != nil {
						break
					}
					if err := protected(ctx, i, msgs[i], fn); err != nil {
						once.Do(func() {
							firstErr = fmt.Errorf("message %s (key %q): %w", msgs[i].Position(), msgs[i].Key, err)
							cancel()
						})
						break
					}
					handled.Add(1)
				}
			}
		}()
	}
	for _, k := range order {
		if ctx.Err() != nil {
			break
		}
		next <- lanes[k]
	}
	close(next)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	if n := handled.Load(); n < int64(len(msgs)) {
		// Only the end of ctx skips messages when no call failed.
		return fmt.Errorf("%d of %d messages not handled: %w", int64(len(msgs))-n, len(msgs), parent.Err())
	}
	return nil
}

// protected calls fn, turning a panic into an error as a handler's is: fn
// runs on a goroutine of ForEachKey's, which the recovery around the
// handler does not cover.
func protected(ctx context.Context, i int, m *Message, fn func(ctx context.Context, i int, m *Message) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrHandlerPanicked, r, debug.Stack())
		}
	}()
	return fn(ctx, i, m)
}
