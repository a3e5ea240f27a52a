// Package retry computes the waits between retries: exponential growth from
// an initial interval up to a cap, with full jitter, on top of
// cenkalti/backoff/v4. The public API of kafkaonce exposes only plain
// durations; backoff types stay here.
package retry

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Policy is the shape of the waits.
type Policy struct {
	// Initial is the envelope of the first wait; each later envelope doubles,
	// up to Max.
	Initial time.Duration
	Max     time.Duration
}

// Wait returns the wait before retry n (from 1) of a sequence whose state is
// kept elsewhere (in a database row, say): uniform in
// [0, min(Max, Initial·2^(n-1))].
func (p Policy) Wait(n int) time.Duration {
	env := p.Initial
	for i := 1; i < n && env < p.Max; i++ {
		env *= 2
	}
	env = min(env, p.Max)
	if env <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(env) + 1))
}

// Backoff yields the waits of one sequence of retries.
type Backoff struct {
	envelope *backoff.ExponentialBackOff
}

// New starts a sequence.
func (p Policy) New() *Backoff {
	e := backoff.NewExponentialBackOff()
	e.InitialInterval = p.Initial
	e.MaxInterval = p.Max
	e.Multiplier = 2
	// The envelope itself is deterministic; the jitter is applied below over
	// the whole range [0, envelope] ("full jitter"), which spreads retries of
	// many workers far better than backoff's ±50% randomisation.
	e.RandomizationFactor = 0
	// Callers bound retries themselves (by attempts, or by shutdown); the
	// library's 15-minute default would silently end a sequence.
	e.MaxElapsedTime = 0
	e.Reset()
	return &Backoff{envelope: e}
}

// Next returns the next wait: uniform in [0, min(Max, Initial·2^n)].
func (b *Backoff) Next() time.Duration {
	env := b.envelope.NextBackOff()
	if env <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(env) + 1))
}

// Reset starts the sequence over, after a success.
func (b *Backoff) Reset() { b.envelope.Reset() }

// Sleep waits for d or until ctx is done, whichever comes first, and returns
// ctx's error in the second case.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
