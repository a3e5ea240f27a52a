package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/later"
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
			d := &deps{cfg: Config{RetryLaterAfter: c.policy, RetryLaterMaxDelay: time.Hour, OnPermanentFailure: kafkaoncetype.DeadLetter}}
			if c.stop {
				d.cfg.OnPermanentFailure = kafkaoncetype.StopPartition
			}
			got := d.retryLater(c.f)
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
	d := &deps{cfg: Config{RetryLaterMaxRetries: 3, RetryLaterMaxDelay: 10 * time.Minute}}
	now := time.Now()
	failed := now.Add(-time.Minute)
	due := failed.Add(4 * time.Minute) // the last wait was 4m
	l := &deadletter.Letter{LastFailedAt: failed, RetryAt: &due}
	for range 100 {
		next := d.nextRetry(l, 1, now)
		if next == nil {
			t.Fatal("no next retry with retries left")
		}
		if w := next.Sub(now); w < 4*time.Minute || w > 8*time.Minute {
			t.Fatalf("next wait %v; want between half and all of twice the last (4m..8m)", w)
		}
	}
	long := failed.Add(8 * time.Minute)
	l.RetryAt = &long
	if w := d.nextRetry(l, 2, now).Sub(now); w > 10*time.Minute {
		t.Fatalf("next wait %v past MaxDelay", w)
	}
	if d.nextRetry(l, 3, now) != nil {
		t.Fatal("a next retry after MaxRetries")
	}
}
