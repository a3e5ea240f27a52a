package engine

import (
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// The breaker's decisions, event by event: failures within the window
// trip it; while the pause runs nothing counts; after it, the first
// failure is the probe's and trips it for twice as long (capped), and a
// message applied closes it.
func TestBreakerDecisions(t *testing.T) {
	t.Parallel()
	const (
		fail   = "fail"
		apply  = "apply"
		resume = "resume"
	)
	type event struct {
		what  string
		topic string
		class kafkaoncetype.Class
		at    time.Duration // since the start
		trip  time.Duration // the pause it makes, 0 for none
		// paused says a pause covers the partition at the event: the
		// breaker's, until its end, unless lifted by hand.
		paused bool
	}
	transient := kafkaoncetype.ClassRetriesExhausted
	cfg := kafkaoncetype.CircuitBreaker{Failures: 3, Window: time.Minute, CoolDown: 10 * time.Second, MaxCoolDown: 30 * time.Second}
	for _, c := range []struct {
		name   string
		cfg    kafkaoncetype.CircuitBreaker
		events []event
	}{
		{"failures within the window trip it", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, time.Second, 0, false}, {fail, "t", transient, 2 * time.Second, 10 * time.Second, false},
		}},
		{"failures older than the window do not count", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 30 * time.Second, 0, false}, {fail, "t", transient, 61 * time.Second, 0, false},
			{fail, "t", transient, 62 * time.Second, 10 * time.Second, false},
		}},
		{"each topic counts its own", cfg, []event{
			{fail, "a", transient, 0, 0, false}, {fail, "b", transient, 0, 0, false}, {fail, "a", transient, 0, 0, false}, {fail, "b", transient, 0, 0, false},
			{fail, "a", transient, 0, 10 * time.Second, false},
		}},
		{"the whole consumer counts as one", kafkaoncetype.CircuitBreaker{Failures: 2, Window: time.Minute, CoolDown: time.Second, MaxCoolDown: time.Second, WholeConsumer: true}, []event{
			{fail, "a", transient, 0, 0, false}, {fail, "b", transient, 0, time.Second, false},
		}},
		{"nothing counts while the pause runs, the probe's failure doubles it", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 10 * time.Second, false},
			{fail, "t", transient, 5 * time.Second, 0, true},
			{fail, "t", transient, 11 * time.Second, 20 * time.Second, false},
			{fail, "t", transient, 32 * time.Second, 30 * time.Second, false}, // capped
			{fail, "t", transient, 63 * time.Second, 30 * time.Second, false},
		}},
		{"a message applied after the pause closes it", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 10 * time.Second, false},
			{apply, "t", "", 11 * time.Second, 0, false},
			{fail, "t", transient, 12 * time.Second, 0, false}, {fail, "t", transient, 12 * time.Second, 0, false},
			{fail, "t", transient, 12 * time.Second, 10 * time.Second, false}, // counted afresh, the pause as at first
		}},
		{"a message applied while the pause runs changes nothing", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 10 * time.Second, false},
			{apply, "t", "", 5 * time.Second, 0, true},
			{fail, "t", transient, 11 * time.Second, 20 * time.Second, false},
		}},
		{"a pause lifted by hand, then a message applied: closed", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 10 * time.Second, false},
			{apply, "t", "", time.Second, 0, false},
			{fail, "t", transient, 11 * time.Second, 0, false}, // no probe: a failure like any
			{fail, "t", transient, 12 * time.Second, 0, false},
			{fail, "t", transient, 13 * time.Second, 10 * time.Second, false},
		}},
		{"a pause lifted by hand, seen at the resume: counted afresh", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 10 * time.Second, false},
			{resume, "t", "", time.Second, 0, false},
			{fail, "t", transient, 11 * time.Second, 0, false}, // after the pause's end: no probe
			{fail, "t", transient, 12 * time.Second, 0, false},
			{fail, "t", transient, 13 * time.Second, 10 * time.Second, false},
		}},
		{"a pause that ended by itself, seen at the resume: the probe is on", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 10 * time.Second, false},
			{resume, "t", "", 11 * time.Second, 0, false},
			{fail, "t", transient, 12 * time.Second, 20 * time.Second, false},
		}},
		{"a pause lifted by hand, then failures: counted afresh", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 10 * time.Second, false},
			{fail, "t", transient, time.Second, 0, false}, {fail, "t", transient, 2 * time.Second, 0, false},
			{fail, "t", transient, 3 * time.Second, 10 * time.Second, false},
		}},
		{"a message applied while closed keeps the count", cfg, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", transient, 0, 0, false}, {apply, "t", "", 0, 0, false}, {fail, "t", transient, 0, 10 * time.Second, false},
		}},
		{"only the classes given count", kafkaoncetype.CircuitBreaker{Failures: 2, Window: time.Minute, CoolDown: time.Second, MaxCoolDown: time.Second,
			Classes: []kafkaoncetype.Class{kafkaoncetype.ClassRetryLater}}, []event{
			{fail, "t", transient, 0, 0, false}, {fail, "t", kafkaoncetype.ClassPermanent, 0, 0, false}, {fail, "t", kafkaoncetype.ClassRetryLater, 0, 0, false},
			{fail, "t", kafkaoncetype.ClassRetryLater, 0, time.Second, false},
		}},
		{"a failure of no class (the database's) never counts", cfg, []event{
			{fail, "t", "", 0, 0, false}, {fail, "t", "", 0, 0, false}, {fail, "t", "", 0, 0, false},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := newBreaker(c.cfg)
			start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
			for i, e := range c.events {
				now := start.Add(e.at)
				switch e.what {
				case apply:
					b.applied(e.topic, now, e.paused)
					continue
				case resume:
					b.resumed(e.topic, now)
					continue
				}
				trip, d, _ := b.failed(e.topic, e.class, now, e.paused)
				if trip != (e.trip > 0) || d != e.trip {
					t.Fatalf("event %d (%s %s at %v): trip %v for %v, want a pause of %v", i, e.what, e.topic, e.at, trip, d, e.trip)
				}
			}
		})
	}
	if newBreaker(kafkaoncetype.CircuitBreaker{}) != nil {
		t.Fatal("the zero CircuitBreaker is not off")
	}

	t.Run("it holds its topic's messages from its trip to its close", func(t *testing.T) {
		b := newBreaker(kafkaoncetype.CircuitBreaker{Failures: 1, Window: time.Minute, CoolDown: time.Second, MaxCoolDown: time.Second})
		start := time.Now()
		if b.holding("t") {
			t.Fatal("holding before any failure")
		}
		b.failed("t", transient, start, false)
		if !b.holding("t") || b.holding("u") {
			t.Fatal("not holding its tripped topic alone")
		}
		b.applied("t", start.Add(2*time.Second), false)
		if b.holding("t") {
			t.Fatal("holding after a message applied closed it")
		}
	})
}
