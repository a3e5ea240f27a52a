package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/permanent"
)

// A Hook observes a relay: metrics, alerting. A hook is any value that
// implements one or more of the Hook* interfaces below; pass hooks in
// RelayConfig.Hooks. NewRelay rejects a value that implements none of
// them (a consumer's hook, say).
//
// HookDelivered and HookDeliveryFailed are called synchronously from the
// relay's goroutine, after the round that recorded the result committed,
// so they must be quick: a slow hook slows delivery. HookBacklog is called
// from a goroutine of its own.
type Hook any

// HookDelivered is called for every row delivered, once its deletion
// committed.
type HookDelivered interface {
	OnDelivered(ctx context.Context, d Delivered)
}

// Delivered describes a row delivered.
type Delivered struct {
	// Destination is the row's topic, or the name the delivery function
	// knows.
	Destination string
	// Latency runs from the row's created_at to the round that recorded
	// its delivery, both read from the database's clock: the time the
	// message took to leave, retries and waits included.
	Latency time.Duration
	// Attempts counts the attempts at the row, this one included.
	Attempts int
}

// HookDeliveryFailed is called for every failed attempt at a row, once the
// round that recorded it (a retry to come, or the row parked) committed.
// A row deferred by the retry budget, or held back behind a failed row of
// its key, was not attempted and is not reported.
type HookDeliveryFailed interface {
	OnDeliveryFailed(ctx context.Context, f DeliveryFailed)
}

// DeliveryFailed describes a failed attempt at a row.
type DeliveryFailed struct {
	Destination string
	// Class sorts Err into a few kinds, fit for a metric label; Err
	// itself is free text and must not be one.
	Class FailureClass
	Err   error
	// Attempts counts the attempts at the row, this one included.
	Attempts int
	// Parked is true when the row will not be retried until an operator
	// retries it (Outbox.Retry): a permanent error, a message too large,
	// or MaxAttempts reached.
	Parked bool
	// NextAttempt is when the row is retried; zero when parked.
	NextAttempt time.Time
}

// FailureClass sorts a delivery error.
type FailureClass string

// The classes of delivery errors.
const (
	// FailurePermanent: the receiver rejected the row for good
	// (Permanent, or HTTPResult's 4xx).
	FailurePermanent FailureClass = "permanent"
	// FailureRetryAfter: the receiver asked to wait (RetryAfter).
	FailureRetryAfter FailureClass = "retry_after"
	// FailureTimeout: the delivery passed DeliveryTimeout.
	FailureTimeout FailureClass = "timeout"
	// FailureTooLarge: a message Kafka can never take.
	FailureTooLarge FailureClass = "too_large"
	// FailurePanic: the delivery function panicked.
	FailurePanic FailureClass = "panic"
	// FailureOther: any other error (a receiver down, a broker error).
	FailureOther FailureClass = "other"
)

// HookBacklog is called every RelayConfig.BacklogInterval while Run runs,
// and once when it starts, with what is left to deliver among the relay's
// destinations. The counts are read from Postgres, so every relay of the
// same destinations reports the same numbers: aggregate them with max,
// not sum.
type HookBacklog interface {
	OnBacklog(ctx context.Context, b Backlog)
}

// classed gives an error the class the relay found it in, where the
// error's own type cannot tell (a timeout, a panic, a message too large).
type classed struct {
	class FailureClass
	err   error
}

func (e *classed) Error() string { return e.err.Error() }
func (e *classed) Unwrap() error { return e.err }

func withClass(class FailureClass, err error) error { return &classed{class: class, err: err} }

// classOf sorts a delivery error.
func classOf(err error) FailureClass {
	var c *classed
	var ra *retryAfterError
	switch {
	case errors.As(err, &c):
		return c.class
	case permanent.Is(err):
		return FailurePermanent
	case errors.As(err, &ra):
		return FailureRetryAfter
	}
	return FailureOther
}

// relayHooks are a relay's hooks, sorted by the interface they implement.
type relayHooks struct {
	delivered []HookDelivered
	failed    []HookDeliveryFailed
	backlog   []HookBacklog
}

func sortHooks(hs []Hook) (relayHooks, error) {
	var out relayHooks
	for i, h := range hs {
		found := false
		if v, ok := h.(HookDelivered); ok {
			out.delivered, found = append(out.delivered, v), true
		}
		if v, ok := h.(HookDeliveryFailed); ok {
			out.failed, found = append(out.failed, v), true
		}
		if v, ok := h.(HookBacklog); ok {
			out.backlog, found = append(out.backlog, v), true
		}
		if !found {
			return relayHooks{}, fmt.Errorf("Hooks[%d] (%T) implements no relay hook interface: pass a value with OnDelivered, OnDeliveryFailed or OnBacklog (see the Hook* interfaces in package outbox; a consumer's hooks go in consumer.Config.Hooks)", i, h)
		}
	}
	return out, nil
}

// report calls the hooks of a round's rows, after its commit; now is the
// database's clock when the round recorded them.
func (r *Relay) report(ctx context.Context, rows []row, outcomes []outcome, now time.Time) {
	for i := range rows {
		o := &outcomes[i]
		rw := &rows[i]
		switch {
		case o.held || o.deferTo > 0:
		case o.err == nil:
			for _, h := range r.hooks.delivered {
				h.OnDelivered(ctx, Delivered{Destination: rw.dest, Latency: max(now.Sub(rw.createdAt), 0), Attempts: rw.attempts + 1})
			}
		default:
			f := DeliveryFailed{Destination: rw.dest, Class: classOf(o.err), Err: o.err, Attempts: rw.attempts + 1, Parked: o.park}
			if !o.park {
				f.NextAttempt = time.Now().Add(o.wait)
			}
			for _, h := range r.hooks.failed {
				h.OnDeliveryFailed(ctx, f)
			}
		}
	}
}
