package kafkaoncetype

import "time"

// CircuitBreaker pauses a topic, or the whole consumer, by itself when its
// messages fail too often: a downstream system that is down makes every
// message fail, and retrying each in turn only holds partitions and piles
// up letters. The pause is an ordinary pause (package pauses), stored in
// Postgres with its reason, obeyed by every member, shown by status and
// the page, and lifted by hand as any other (kafkaonce resume: the breaker
// then counts afresh). It ends by itself after CoolDown: the failing topic
// is then tried again (a probe), and the first failure of the probe
// pauses it again for twice as long, up to MaxCoolDown, while a message
// applied closes the breaker. A pause drops nothing and reorders nothing:
// each partition finishes the batch it is in, stops waiting between the
// retries of a failing message, and goes on from where it stopped once
// resumed. From its trip until it closes, the breaker holds the failing
// message: its pauses and probes do not spend the message's attempts
// (Retry.MaxAttempts, Retry.MaxElapsed), so it is not set aside for them.
//
// Each member counts the failures it sees; any member that trips pauses
// the topic for all. The zero CircuitBreaker is off.
type CircuitBreaker struct {
	// Failures is how many failed attempts within Window trip the
	// breaker; 0 leaves it off.
	Failures int
	// Window is how far back failures count. Defaults to
	// DefaultBreakerWindow.
	Window time.Duration
	// Classes are the failures counted, by the class HookMessageFailed
	// reports: ClassRetriesExhausted for a failure retried in place,
	// ClassRetryLater for one set aside to be retried later, ClassPermanent
	// and the others for one set aside for good. Empty counts every class.
	Classes []Class
	// CoolDown is how long the first pause lasts. Defaults to
	// DefaultBreakerCoolDown.
	CoolDown time.Duration
	// MaxCoolDown caps the pause, which doubles after each failed probe.
	// Defaults to DefaultBreakerMaxCoolDown (or CoolDown, when longer).
	MaxCoolDown time.Duration
	// WholeConsumer pauses every topic of the consumer when any trips the
	// breaker, instead of the failing topic alone: for topics that share
	// the downstream system.
	WholeConsumer bool
}

// Defaults of CircuitBreaker.
const (
	DefaultBreakerWindow      = time.Minute
	DefaultBreakerCoolDown    = 30 * time.Second
	DefaultBreakerMaxCoolDown = 10 * time.Minute
)
