package engine

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// breaker is a member's circuit breaker (see kafkaoncetype.CircuitBreaker):
// what it counts, and for each scope (a topic, or "" for the whole
// consumer) where it stands. Its decisions take the time as an argument,
// so that they are values a table test can check.
type breaker struct {
	cfg kafkaoncetype.CircuitBreaker

	mu     sync.Mutex
	scopes map[string]*breakerScope
}

// breakerScope is one scope's state: closed (counting failures), open
// until a time (paused), or probing (the pause ended, and the first
// failure trips it again, for twice as long).
type breakerScope struct {
	failures []time.Time
	openTill time.Time
	probing  bool
	coolDown time.Duration
}

// newBreaker returns cfg's breaker, nil when it is off; consumer.New has
// given cfg its defaults, and these hold for a Config made otherwise.
func newBreaker(cfg kafkaoncetype.CircuitBreaker) *breaker {
	if cfg.Failures <= 0 {
		return nil
	}
	cfg.Window = cmp.Or(cfg.Window, kafkaoncetype.DefaultBreakerWindow)
	cfg.CoolDown = cmp.Or(cfg.CoolDown, kafkaoncetype.DefaultBreakerCoolDown)
	cfg.MaxCoolDown = max(cmp.Or(cfg.MaxCoolDown, kafkaoncetype.DefaultBreakerMaxCoolDown), cfg.CoolDown)
	return &breaker{cfg: cfg, scopes: map[string]*breakerScope{}}
}

// scopeOf is the key of topic's scope.
func (b *breaker) scopeOf(topic string) string {
	if b.cfg.WholeConsumer {
		return ""
	}
	return topic
}

// counts reports whether a failure of class counts.
func (b *breaker) counts(class kafkaoncetype.Class) bool {
	return class != "" && (len(b.cfg.Classes) == 0 || slices.Contains(b.cfg.Classes, class))
}

// failed counts a failure of class on topic at now, paused saying whether
// a pause covers the failing partition now, and says whether it trips the
// breaker, for how long, and how many failures it counted.
func (b *breaker) failed(topic string, class kafkaoncetype.Class, now time.Time, paused bool) (trip bool, pause time.Duration, counted int) {
	if b == nil || !b.counts(class) {
		return false, 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.scope(topic)
	switch {
	case now.Before(s.openTill) && paused:
		// The failures of batches in progress when it tripped.
		return false, 0, 0
	case now.Before(s.openTill):
		// The pause was lifted by hand (or never stored): the breaker
		// counts afresh, as one that never tripped.
		*s = breakerScope{coolDown: b.cfg.CoolDown}
	case !s.openTill.IsZero():
		// The pause ended: this failure is the probe's.
		s.probing, s.openTill = true, time.Time{}
	}
	if s.probing {
		s.coolDown = min(2*s.coolDown, b.cfg.MaxCoolDown)
		s.openTill, s.failures = now.Add(s.coolDown), s.failures[:0]
		return true, s.coolDown, 1
	}
	cut := now.Add(-b.cfg.Window)
	s.failures = slices.DeleteFunc(s.failures, func(t time.Time) bool { return !t.After(cut) })
	s.failures = append(s.failures, now)
	if len(s.failures) < b.cfg.Failures {
		return false, 0, 0
	}
	counted = len(s.failures)
	s.openTill, s.failures = now.Add(s.coolDown), s.failures[:0]
	return true, s.coolDown, counted
}

// applied closes topic's breaker at now when the pause it made has ended
// (a message applied after it is the probe that succeeded) or was lifted
// by hand (paused false before its end: the operator chose to go on). A
// message applied while the pause holds was in a batch under way when the
// breaker tripped, and changes nothing.
func (b *breaker) applied(topic string, now time.Time, paused bool) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.scope(topic)
	if now.Before(s.openTill) && paused || !s.probing && s.openTill.IsZero() {
		return
	}
	*s = breakerScope{coolDown: b.cfg.CoolDown}
}

// resumed tells the breaker that topic's partition fetches again at now.
// Before the end of the pause the breaker made, that is an operator's
// resume: the operator chose to go on, and the breaker counts afresh, as
// one that never tripped (its first failure is no failed probe). After
// it, the pause ended by itself, and the probe is on.
func (b *breaker) resumed(topic string, now time.Time) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.scope(topic); now.Before(s.openTill) {
		*s = breakerScope{coolDown: b.cfg.CoolDown}
	}
}

// holding reports whether the breaker has tripped for topic and not closed
// since: its messages are not set aside for running out of attempts, since
// the breaker's pauses, and the probes after them, are what spends them.
func (b *breaker) holding(topic string) bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.scope(topic)
	return s.probing || !s.openTill.IsZero()
}

// scope is topic's state; b.mu is held.
func (b *breaker) scope(topic string) *breakerScope {
	s := b.scopes[b.scopeOf(topic)]
	if s == nil {
		s = &breakerScope{coolDown: b.cfg.CoolDown}
		b.scopes[b.scopeOf(topic)] = s
	}
	return s
}

// breakerFailed counts a failure of msg for the breaker, and pauses the
// scope when it trips. The pause is written at once, in a transaction of
// its own, and applied in this process before the worker goes on; other
// members apply it at their next read of the pauses. A failed write is
// logged: the breaker stays open until the pause would have ended, and
// the messages are retried as without one.
func (w *worker) breakerFailed(ctx context.Context, msg *kafkaoncetype.Message, f *failure) {
	if w.breaker == nil {
		return
	}
	trip, d, counted := w.breaker.failed(msg.Topic, f.kind, time.Now(), w.pausedNow())
	if !trip {
		return
	}
	scope := pauses.Topic(msg.Topic)
	if w.breaker.cfg.WholeConsumer {
		scope = pauses.All()
	}
	why := fmt.Sprintf("circuit breaker: the probe after the last pause failed (%s): paused for %s", firstLine(f.err.Error()), d)
	if counted > 1 {
		why = fmt.Sprintf("circuit breaker: %d failures in %s (last at %s/%d offset %d: %s): paused for %s",
			counted, w.breaker.cfg.Window, msg.Topic, msg.Partition, msg.Offset, firstLine(f.err.Error()), d)
	}
	w.log.Warn("circuit breaker tripped: pausing "+scope.String()+"; it resumes by itself for a probe, or with kafkaonce resume",
		w.logAttrs(slog.Duration("pause", d), slog.Int("failures", counted), slog.String("class", string(f.kind)), slog.String("error", f.err.Error()))...)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := w.pauseAs(pctx, scope, d, breakerBy(w.cfg.Name), why); err != nil {
		w.log.Warn("circuit breaker: could not store the pause; the messages are retried as without one", w.logAttrs(slog.String("error", err.Error()))...)
	}
}

// pausedNow reports whether a pause covers the worker's partition, as the
// consumer last read its pauses.
func (w *worker) pausedNow() bool {
	_, paused, _, _ := w.pauses.state(w.topic, w.partition)
	return paused
}

// breakerBy names the circuit breaker as the author of its pauses.
func breakerBy(consumer string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("circuit breaker of %s on %s (pid %d)", consumer, host, os.Getpid())
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
