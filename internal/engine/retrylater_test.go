package engine

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/later"
	"github.com/kafkaonce/kafkaonce/internal/permanent"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

func TestRetryLaterDecision(t *testing.T) {
	partner := errors.New("partner down")
	marked := later.Mark(partner, time.Minute)
	for _, c := range []struct {
		name      string
		f         *failure
		policy    time.Duration
		stop      bool
		wantLater bool
		wantAfter time.Duration
	}{
		{"a marked failure is set aside for its delay", newFailure(classTransient, deadletter.ClassRetriesExhausted, marked), 0, false, true, time.Minute},
		{"a delay past MaxDelay is cut to it", newFailure(classTransient, "", later.Mark(partner, 48*time.Hour)), 0, false, true, time.Hour},
		{"an unmarked failure without the policy is retried in place", newFailure(classTransient, "", partner), 0, false, false, 0},
		{"the policy sets any failure that could pass aside", newFailure(classTransient, "", partner), 5 * time.Second, false, true, 5 * time.Second},
		{"the policy leaves an uncounted failure a try alone", &failure{class: classTransient, err: partner, uncounted: true}, 5 * time.Second, false, false, 0},
		{"a permanent failure is set aside for good", newFailure(classPermanent, deadletter.ClassPermanent, marked), 5 * time.Second, false, false, 0},
		{"a database failure runs the transaction again", newFailure(classInfra, "", marked), 5 * time.Second, false, false, 0},
		{"a consumer that stops its partition retries in place", newFailure(classTransient, "", marked), 0, true, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &deps{cfg: Config{Config: settings.Config{RetryLater: kafkaoncetype.RetryLaterPolicy{After: c.policy, MaxDelay: time.Hour}, OnPermanentFailure: kafkaoncetype.DeadLetter}}}
			if c.stop {
				d.cfg.OnPermanentFailure = kafkaoncetype.StopPartition
			}
			got := d.cfg.retryLater(c.f)
			isLater := got.kind == deadletter.ClassRetryLater
			if isLater != c.wantLater || isLater && (got.class != classPermanent || got.retryAfter != c.wantAfter) {
				t.Fatalf("retryLater = class %v kind %q after %v; want later %v after %v", got.class, got.kind, got.retryAfter, c.wantLater, c.wantAfter)
			}
			if !isLater && got != c.f {
				t.Fatal("a failure not set aside for later was changed")
			}
		})
	}
}

func TestNextRetry(t *testing.T) {
	partner := errors.New("partner down")
	d := &deps{cfg: Config{Config: settings.Config{RetryLater: kafkaoncetype.RetryLaterPolicy{MaxRetries: 3, MaxDelay: 10 * time.Minute}}}}
	now := time.Now()
	failed := now.Add(-time.Minute)
	due := failed.Add(4 * time.Minute) // the last wait was 4m
	l := &deadletter.Letter{LastFailedAt: failed, RetryAt: &due}
	for range 100 {
		next := d.cfg.nextRetry(l, 1, partner, now)
		if next == nil {
			t.Fatal("no next retry with retries left")
		}
		if w := next.Sub(now); w < 4*time.Minute || w > 8*time.Minute {
			t.Fatalf("next wait %v; want between half and all of twice the last (4m..8m)", w)
		}
	}
	long := failed.Add(8 * time.Minute)
	l.RetryAt = &long
	if w := d.cfg.nextRetry(l, 2, partner, now).Sub(now); w > 10*time.Minute {
		t.Fatalf("next wait %v past MaxDelay", w)
	}
	if d.cfg.nextRetry(l, 3, partner, now) != nil {
		t.Fatal("a next retry after MaxRetries")
	}
	t.Run("a retry that asks for a delay gets it, within MaxDelay", func(t *testing.T) {
		for _, c := range []struct {
			asked, want time.Duration
		}{{30 * time.Second, 30 * time.Second}, {0, 0}, {-time.Minute, 0}, {time.Hour, 10 * time.Minute}} {
			next := d.cfg.nextRetry(l, 1, fmt.Errorf("%w: %w", errHandlerFailed, later.Mark(partner, c.asked)), now)
			if next == nil || next.Sub(now) != c.want {
				t.Fatalf("RetryLater(err, %v) on a retry: next %v; want due in %v", c.asked, next, c.want)
			}
		}
		if d.cfg.nextRetry(l, 3, later.Mark(partner, time.Second), now) != nil {
			t.Fatal("a marked retry after MaxRetries")
		}
	})
}

// With a time budget, a letter is retried until that long after its first
// failure, however many retries it takes, and the last retry is due at
// the budget's end at the latest; MaxRetries, when set too, may end them
// first.
func TestNextRetryWithinATimeBudget(t *testing.T) {
	partner := errors.New("partner down")
	now := time.Now()
	failed := now.Add(-time.Minute)
	due := failed.Add(30 * time.Second)
	for _, c := range []struct {
		name       string
		maxRetries int
		firstFail  time.Time
		retries    int
		cause      error
		want       string // "none", "in budget", "at the budget's end"
	}{
		{"retries past the default count go on within the budget", 0, now.Add(-time.Hour), 50, partner, "in budget"},
		{"a retry due past the budget is due at its end", 0, now.Add(-24*time.Hour + 10*time.Second), 3, partner, "at the budget's end"},
		{"a retry asked for past the budget is due at its end", 0, now.Add(-24*time.Hour + 10*time.Second), 3, later.Mark(partner, time.Hour), "at the budget's end"},
		{"none once the budget is spent", 0, now.Add(-24 * time.Hour), 3, partner, "none"},
		{"MaxRetries ends them first", 5, now.Add(-time.Hour), 5, partner, "none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &deps{cfg: Config{Config: settings.Config{RetryLater: kafkaoncetype.RetryLaterPolicy{MaxRetries: c.maxRetries, MaxDelay: 10 * time.Minute, MaxElapsed: 24 * time.Hour}}}}
			l := &deadletter.Letter{FirstFailedAt: c.firstFail, LastFailedAt: failed, RetryAt: &due}
			next := d.cfg.nextRetry(l, c.retries, c.cause, now)
			end := c.firstFail.Add(24 * time.Hour)
			var got string
			switch {
			case next == nil:
				got = "none"
			case next.Equal(end):
				got = "at the budget's end"
			case next.After(now) && next.Before(end):
				got = "in budget"
			default:
				got = fmt.Sprintf("due %v, budget ends %v", next, end)
			}
			if got != c.want {
				t.Fatalf("next retry: %s; want %s", got, c.want)
			}
		})
	}
}

// A failed retry counts unless the database failed it: a network error is
// the database's outside the handler, and inside it once the transaction's
// connection is lost.
func TestRetryOutcome(t *testing.T) {
	d := &deps{cfg: Config{Config: settings.Config{RetryLater: kafkaoncetype.RetryLaterPolicy{MaxRetries: 3, MaxDelay: 10 * time.Minute}}}}
	now := time.Now()
	l := &deadletter.Letter{LastFailedAt: now.Add(-time.Minute)}
	network := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	handler := func(err error) error { return fmt.Errorf("%w: %w", errHandlerFailed, err) }
	for _, c := range []struct {
		name      string
		cause     error
		wantCount bool
		wantFinal deadletter.Class
		wantNext  bool
	}{
		{"the handler's own failure counts", handler(errors.New("partner down")), true, deadletter.ClassRetriesExhausted, true},
		{"the handler's network call counts", handler(network), true, deadletter.ClassRetriesExhausted, true},
		{"a network error once the connection is lost counts nothing", fmt.Errorf("%w: %w", errConnLost, handler(network)), false, "", false},
		{"a network error of the retry's own statements counts nothing", network, false, "", false},
		{"a failed handler whose savepoint could not be rolled back, the connection lost", errors.Join(fmt.Errorf("%w: %w", errConnLost, handler(network)), network), false, "", false},
		{"a permanent failure ends the retries", handler(permanent.Mark(errors.New("no such account"))), true, deadletter.ClassPermanent, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			next, final, count := d.retryOutcome(l, c.cause, now)
			if count != c.wantCount || final != c.wantFinal || (next != nil) != c.wantNext {
				t.Fatalf("retryOutcome = next %v, final %q, count %v; want next %v, final %q, count %v", next, final, count, c.wantNext, c.wantFinal, c.wantCount)
			}
		})
	}
}
