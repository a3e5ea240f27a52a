package outbox

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// deliveryGrace is how long a call past DeliveryTimeout, its context
// cancelled, may take to return before it is abandoned.
const deliveryGrace = 2 * time.Second

// DeliverFunc delivers one message to a receiver other than Kafka, typically
// an HTTP API, using d.ID as the idempotency key. Return nil once the
// receiver has it; Permanent(err) when it rejected the message for good;
// RetryAfter(err, d) when it asked to wait; any other error to retry with
// backoff. HTTPResult does this classification for HTTP responses.
type DeliverFunc func(ctx context.Context, d *Delivery) error

// Delivery is one attempt at delivering a message.
type Delivery struct {
	ID          string
	Destination string
	Key, Value  []byte
	Headers     []Header
	// Attempt counts from 1.
	Attempt   int
	CreatedAt time.Time
}

// deliver hands the rows to Deliver: keys in parallel, each key's rows in
// order; once a row of a key failed, the key's later rows are held.
func (r *Relay) deliver(ctx context.Context, rows []row, outcomes []outcome) {
	byKey := map[string][]int{}
	var order []string
	for i := range rows {
		k := string(rows[i].key)
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	sem := make(chan struct{}, r.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func(chain []int) {
			defer wg.Done()
			defer func() { <-sem }()
			for n, i := range chain {
				if !outcomes[i].pending() {
					continue
				}
				rw := &rows[i]
				err := r.call(ctx, &Delivery{ID: rw.id, Destination: rw.dest, Key: rw.key, Value: rw.val, Headers: rw.headers,
					Attempt: rw.attempts + 1, CreatedAt: rw.createdAt})
				outcomes[i] = r.judge(rw, err)
				if err != nil {
					for _, later := range chain[n+1:] {
						if outcomes[later].pending() {
							outcomes[later] = outcome{held: true}
						}
					}
					return
				}
			}
		}(byKey[k])
	}
	wg.Wait()
}

// call runs Deliver under DeliveryTimeout, in a goroutine of its own so that
// a call that ignores its context can be abandoned.
func (r *Relay) call(ctx context.Context, d *Delivery) error {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.DeliveryTimeout)
	defer cancel()
	done := make(chan error, 1) // buffered: an abandoned call still returns
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- withClass(FailurePanic, fmt.Errorf("outbox: the delivery function panicked: %v", p))
			}
		}()
		done <- r.cfg.Deliver(cctx, d)
	}()
	timedOut := func(err error) error {
		if err != nil && cctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
			return withClass(FailureTimeout, fmt.Errorf("outbox: Deliver exceeded DeliveryTimeout (%v): %w", r.cfg.DeliveryTimeout, err))
		}
		return err
	}
	select {
	case err := <-done:
		return timedOut(err)
	case <-cctx.Done():
	}
	grace := time.NewTimer(deliveryGrace)
	defer grace.Stop()
	select {
	case err := <-done:
		return timedOut(err)
	case <-grace.C:
		return withClass(FailureTimeout, fmt.Errorf("outbox: Deliver did not return within DeliveryTimeout (%v) and %v after its context was cancelled; it was abandoned, and the row is retried",
			r.cfg.DeliveryTimeout, deliveryGrace))
	}
}
