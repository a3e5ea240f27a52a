package consumertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// settled counts messages the consumer finished with, by how, and keeps
// what keeps the others from settling.
type settled struct {
	applied, skipped, deadLettered atomic.Int64

	mu        sync.Mutex
	stopped   *consumer.PartitionError
	lastFail  string
	failCount int
	// firstStart holds where each partition's processing started at its
	// first assignment in this run: the messages below it were processed
	// before (a kept position), and no hook reports them. Later
	// assignments start where this run's own commits left off, which the
	// hooks reported message by message.
	firstStart map[int]int64
	// seen holds, per partition and offset, what the hooks reported of a
	// message in this run: its failed attempts, and how it settled (Fate
	// is empty until it has).
	seen map[int]map[int64]*Outcome
}

func newSettled() *settled {
	return &settled{firstStart: map[int]int64{}, seen: map[int]map[int64]*Outcome{}}
}

func (s *settled) OnPartitionAssigned(_ context.Context, a consumer.PartitionAssignment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.firstStart[a.Partition]; !ok {
		s.firstStart[a.Partition] = a.Start
	}
}

// outcome is what was seen of m so far; call it with s.mu held.
func (s *settled) outcome(m *consumer.Message) *Outcome {
	if s.seen[m.Partition] == nil {
		s.seen[m.Partition] = map[int64]*Outcome{}
	}
	o := s.seen[m.Partition][m.Offset]
	if o == nil {
		o = &Outcome{}
		s.seen[m.Partition][m.Offset] = o
	}
	return o
}

// report notes that m settled, as fill says. The hook's message belongs
// to the consumer, which reuses it: only its id is kept.
func (s *settled) report(m *consumer.Message, fill func(*Outcome)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.outcome(m)
	o.id = m.ID
	fill(o)
}

// outcomeAt returns what was seen of the message at partition p, offset
// off (nil: nothing).
func (s *settled) outcomeAt(p int, off int64) *Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[p][off]
}

// done reports whether every message of perPartition (offsets 0 to n-1 of
// each partition) is settled: below where its partition first started in
// this run, or reported by a hook.
func (s *settled) done(perPartition map[int]int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, n := range perPartition {
		start, ok := s.firstStart[p]
		if !ok {
			return false
		}
		for o := start; o < int64(n); o++ {
			if r := s.seen[p][o]; r == nil || r.Fate == "" {
				return false
			}
		}
	}
	return true
}

func (s *settled) OnMessageApplied(_ context.Context, m *consumer.Message) {
	s.applied.Add(1)
	s.report(m, func(o *Outcome) { o.Fate = Applied })
}
func (s *settled) OnMessageSkipped(_ context.Context, m *consumer.Message, why consumer.SkipReason) {
	s.skipped.Add(1)
	s.report(m, func(o *Outcome) { o.Fate, o.SkipReason = Skipped, why })
}
func (s *settled) OnMessageDeadLettered(_ context.Context, m *consumer.Message, l consumer.DeadLettered) {
	s.deadLettered.Add(1)
	s.report(m, func(o *Outcome) { o.Fate, o.DeadLetter = DeadLettered, l })
}
func (s *settled) OnPartitionStopped(_ context.Context, err *consumer.PartitionError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = err
}
func (s *settled) OnMessageFailed(_ context.Context, m *consumer.Message, f consumer.Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failCount++
	o := s.outcome(m)
	o.Failures = append(o.Failures, f)
	s.lastFail = fmt.Sprintf("message %q (%s), attempt %d: %v", m.ID, m.Position(), f.Attempt, f.Err)
}

func (s *settled) total() int64 { return s.applied.Load() + s.skipped.Load() + s.deadLettered.Load() }

// stuck says why the run cannot settle, or "".
func (s *settled) stuck() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped != nil {
		return fmt.Sprintf("a partition stopped, so its messages cannot settle: %v", s.stopped)
	}
	return ""
}

func runUntilSettled(tb testing.TB, db consumer.DB, cfg consumer.Config, perPartition map[int]int, timeout time.Duration, what string) *settled {
	tb.Helper()
	n := 0
	for _, c := range perPartition {
		n += c
	}
	count := newSettled()
	cfg.Hooks = append(append([]consumer.Hook(nil), cfg.Hooks...), count)
	c, err := consumer.New(db, &cfg)
	if err != nil {
		tb.Fatalf("consumertest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(timeout)
	for !count.done(perPartition) && count.stuck() == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		tb.Fatalf("consumertest: %s: %v", what, err)
	}
	if why := count.stuck(); why != "" {
		tb.Fatalf("consumertest: %s: %d of %d messages settled: %s", what, count.total(), n, why)
	}
	if got := count.total(); !count.done(perPartition) {
		count.mu.Lock()
		last, fails := count.lastFail, count.failCount
		count.mu.Unlock()
		if fails > 0 {
			tb.Fatalf("consumertest: %s: %d of %d messages settled within %v; %d failed attempts, the last: %s (a transient error is retried until it succeeds or the attempts run out; mark errors that retrying cannot cure with consumer.Permanent)",
				what, got, n, timeout, fails, last)
		}
		tb.Fatalf("consumertest: %s: %d of %d messages settled within %v, with no failed attempt: raise the options' Timeout if the handler is slow", what, got, n, timeout)
	}
	return count
}
