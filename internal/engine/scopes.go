package engine

import (
	"context"
	"sync"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Scopes let a hook hand its own context to a batch transaction and to a
// handler call, and learn when they end: tracing starts a span there, and
// its context must reach the handler, the hooks called on the batch's
// behalf and the user's statements. The engine knows nothing of spans; it
// only passes the context on and calls the end functions.
//
// A batch's scope covers one transaction: from before HookBatchStart to
// after the hooks of the messages it committed (applied, skipped, set
// aside), so that those can still be noted on the batch's span. A
// handler's scope covers one call of the handler for one message, until it
// returns or is abandoned; a BatchHandler called for several messages runs
// in the batch's scope.
//
// A hook's context lends its values only: deadlines and cancellation stay
// the engine's, so that a hook that detaches or cancels its context can
// neither keep a handler past shutdown nor stop a batch. A hook that
// returns no context, or panics, opens no scope: a hook's bug is not a
// message's.

func noEnd()           {}
func noEndErr(_ error) {}

// valuesOf is ctx, its deadline and cancellation, with the values of vals.
type valuesOf struct {
	context.Context
	vals context.Context
}

func (c valuesOf) Value(key any) any { return c.vals.Value(key) }

// lend returns ctx with the values of the context a hook returned, if any.
func lend(ctx, hooked context.Context) context.Context {
	if hooked == nil || hooked == ctx {
		return ctx
	}
	return valuesOf{Context: ctx, vals: hooked}
}

// safely calls f, and reports whether it returned without panicking.
func safely(f func()) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	f()
	return true
}

// enterBatch opens the batch scopes of the hooks for the transaction over
// items, in order; end closes them in reverse order.
func (h *Hooks) enterBatch(ctx context.Context, info kafkaoncetype.BatchInfo, items []item) (_ context.Context, end func()) {
	if len(h.BatchScope) == 0 {
		return ctx, noEnd
	}
	msgs := make([]*kafkaoncetype.Message, len(items))
	for i := range items {
		msgs[i] = &items[i].msg
	}
	var ends []func()
	for _, s := range h.BatchScope {
		var hooked context.Context
		var e func()
		if safely(func() { hooked, e = s(ctx, info, msgs) }) {
			ctx = lend(ctx, hooked)
			if e != nil {
				ends = append(ends, e)
			}
		}
	}
	return ctx, func() {
		for i := len(ends) - 1; i >= 0; i-- {
			safely(ends[i])
		}
	}
}

// enterHandler opens the handler scopes of the hooks for one handler call
// with msg; end, given the call's error, closes them in reverse order,
// once: whichever comes first of the call's return and its abandonment.
func (h *Hooks) enterHandler(ctx context.Context, msg *kafkaoncetype.Message) (_ context.Context, end func(error)) {
	if len(h.HandlerScope) == 0 {
		return ctx, noEndErr
	}
	var ends []func(error)
	for _, s := range h.HandlerScope {
		var hooked context.Context
		var e func(error)
		if safely(func() { hooked, e = s(ctx, msg) }) {
			ctx = lend(ctx, hooked)
			if e != nil {
				ends = append(ends, e)
			}
		}
	}
	var once sync.Once
	return ctx, func(err error) {
		once.Do(func() {
			for i := len(ends) - 1; i >= 0; i-- {
				safely(func() { ends[i](err) })
			}
		})
	}
}
