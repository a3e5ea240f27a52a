package engine

import (
	"math/rand/v2"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/later"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// retryLater turns f, the failure of a handler call, into the failure
// that sets its message aside to be retried later, when the handler asked
// for it (consumer.RetryLater) or the policy does (RetryLaterAfter, for a
// failure that could pass); otherwise it returns f. Neither applies to a
// failure of the database (the transaction runs again), to one that is
// permanent (it is set aside for good), to a consumer that stops its
// partition rather than set a message aside (a marked error is then
// retried in place as any error that could pass), and, by the policy
// alone, to an uncounted failure (it may be a lost race's; the message
// gets a try alone first).
func (c *Config) retryLater(f *failure) *failure {
	if f.class != classTransient || c.OnPermanentFailure != kafkaoncetype.DeadLetter {
		return f
	}
	d, marked := later.After(f.err)
	switch {
	case marked:
	case c.RetryLater.After > 0 && !f.uncounted:
		d = c.RetryLater.After
	default:
		return f
	}
	g := *f
	g.class, g.kind, g.uncounted = classPermanent, deadletter.ClassRetryLater, false
	g.retryAfter = min(max(d, 0), c.RetryLater.MaxDelay)
	return &g
}

// nextRetry is when a letter whose retry failed (its retries-th) with
// cause is due again, nil once it has had its retries: RetryLaterMaxRetries
// of them, or (with RetryLaterMaxElapsed) those due until that long after
// its first failure, the last one due then at the latest. A cause marked
// by consumer.RetryLater says when, within RetryLaterMaxDelay. Otherwise
// the wait doubles from the last one, capped by RetryLaterMaxDelay, with
// jitter (between half and all of it) so that letters set aside together
// by one outage do not all come back at once.
func (c *Config) nextRetry(l *deadletter.Letter, retries int, cause error, now time.Time) *time.Time {
	if n := c.RetryLater.MaxRetries; n > 0 && retries >= n {
		return nil
	}
	var at time.Time
	if d, marked := later.After(cause); marked {
		at = now.Add(min(max(d, 0), c.RetryLater.MaxDelay))
	} else {
		last := time.Second
		if l.RetryAt != nil {
			last = max(l.RetryAt.Sub(l.LastFailedAt), time.Second)
		}
		d := min(2*last, c.RetryLater.MaxDelay)
		at = now.Add(d/2 + rand.N(d/2+1))
	}
	if budget := c.RetryLater.MaxElapsed; budget > 0 {
		end := l.FirstFailedAt.Add(budget)
		if !now.Before(end) {
			return nil
		}
		at = minTime(at, end)
	}
	return &at
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
