package engine

import "context"

// Scopes let a hook hand its own context to a batch transaction and to a
// handler call, and learn when they end: tracing starts a span there, and
// its context must reach the handler, the hooks called on the batch's
// behalf and the user's statements. The engine knows nothing of spans; it
// only passes the context on and calls the end functions.
//
// A batch's scope covers one transaction: from before HookBatchStart to
// after the hooks of the messages it committed (applied, skipped, set
// aside), so that those can still be noted on the batch's span. A
// handler's scope covers one call of the handler for one message; a
// BatchHandler called for several messages runs in the batch's scope.

func noEnd()           {}
func noEndErr(_ error) {}

// enterBatch opens the batch scopes of the hooks for the transaction over
// items, in order; end closes them in reverse order.
func (h *Hooks) enterBatch(ctx context.Context, info BatchInfo, items []item) (_ context.Context, end func()) {
	if len(h.BatchScope) == 0 {
		return ctx, noEnd
	}
	msgs := make([]*Message, len(items))
	for i := range items {
		msgs[i] = &items[i].msg
	}
	if len(h.BatchScope) == 1 {
		return h.BatchScope[0](ctx, info, msgs)
	}
	ends := make([]func(), len(h.BatchScope))
	for i, s := range h.BatchScope {
		ctx, ends[i] = s(ctx, info, msgs)
	}
	return ctx, func() {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i]()
		}
	}
}

// enterHandler opens the handler scopes of the hooks for one handler call
// with msg; end, given the call's error, closes them in reverse order.
func (h *Hooks) enterHandler(ctx context.Context, msg *Message) (_ context.Context, end func(error)) {
	switch len(h.HandlerScope) {
	case 0:
		return ctx, noEndErr
	case 1:
		return h.HandlerScope[0](ctx, msg)
	}
	ends := make([]func(error), len(h.HandlerScope))
	for i, s := range h.HandlerScope {
		ctx, ends[i] = s(ctx, msg)
	}
	return ctx, func(err error) {
		for i := len(ends) - 1; i >= 0; i-- {
			ends[i](err)
		}
	}
}
