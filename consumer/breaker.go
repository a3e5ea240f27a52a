package consumer

import (
	"slices"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// CircuitBreaker pauses a topic, or the whole consumer, by itself when its
// messages fail too often, and tries it again after a cool-down (see
// kafkaoncetype.CircuitBreaker for the whole behaviour):
//
//	cfg.CircuitBreaker = consumer.CircuitBreaker{
//		Failures: 20, Window: time.Minute, // 20 failed attempts in a minute trip it
//		CoolDown: 30 * time.Second,         // paused 30s, then a probe; 60s, 120s... after failed probes
//	}
//
// The pause it makes is an ordinary pause, by "circuit breaker of NAME",
// with the failures that tripped it as its reason: kafkaonce status and
// the page show it, HookPartitionPaused reports it, and kafkaonce resume
// lifts it early. A breaker never sets a message aside nor skips one: a
// message retried in place when it trips stops waiting, and is tried
// again when the pause ends.
type CircuitBreaker = kafkaoncetype.CircuitBreaker

// Defaults of CircuitBreaker.
const (
	DefaultBreakerWindow      = kafkaoncetype.DefaultBreakerWindow
	DefaultBreakerCoolDown    = kafkaoncetype.DefaultBreakerCoolDown
	DefaultBreakerMaxCoolDown = kafkaoncetype.DefaultBreakerMaxCoolDown
)

// checkBreaker names what is wrong with b, given its defaults.
func checkBreaker(b CircuitBreaker, bad func(string, ...any)) {
	off := b.Failures == 0
	switch {
	case b.Failures < 0:
		bad("CircuitBreaker.Failures must not be negative (got %d): 0 leaves the breaker off", b.Failures)
	case off && (b.Window != 0 || b.CoolDown != 0 || b.MaxCoolDown != 0 || len(b.Classes) > 0 || b.WholeConsumer):
		bad("CircuitBreaker is set but its Failures is 0, which leaves it off: set Failures to how many failed attempts within Window trip it")
	case off:
	case b.Window < time.Second:
		bad("CircuitBreaker.Window must be at least 1s (got %v)", b.Window)
	case b.CoolDown < time.Second:
		bad("CircuitBreaker.CoolDown must be at least 1s (got %v): the pause it makes ends after it", b.CoolDown)
	case b.MaxCoolDown < b.CoolDown:
		bad("CircuitBreaker.MaxCoolDown must not be shorter than CoolDown (got %v and %v)", b.MaxCoolDown, b.CoolDown)
	}
	for _, c := range b.Classes {
		if !slices.Contains(kafkaoncetype.Classes, c) {
			bad("CircuitBreaker.Classes: %q is not a class kafkaonce reports; use the deadletter.Class* constants (deadletter.ClassRetriesExhausted for failures retried in place)", c)
		}
	}
}
