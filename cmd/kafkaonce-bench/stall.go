package main

import (
	"sync"
	"time"
)

// stalls follows how fairly a run progresses: for each partition, the
// longest time without progress while it still had messages left — the
// gap between two of its commits, from the run's start to its first
// commit, and from its last commit to the run's end when it never
// finished. A high msgs/s can hide a partition that waits for seconds
// while the others race (behind their locks, say); the longest stall over
// all partitions shows it.
type stalls struct {
	mu      sync.Mutex
	left    []int   // messages each partition still has
	last    []int64 // unix nanoseconds of its last commit (0: none yet)
	longest time.Duration
}

// newStalls follows partitions holding these message counts; nil (the
// counts are not known, as in latency runs) follows nothing.
func newStalls(perPartition []int) *stalls {
	if perPartition == nil {
		return nil
	}
	return &stalls{left: append([]int(nil), perPartition...), last: make([]int64, len(perPartition))}
}

// commit records n messages of partition p committed at t; start is the
// run's start (unix nanoseconds).
func (s *stalls) commit(p, n int, t time.Time, start int64) {
	if s == nil || p < 0 || p >= len(s.left) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.left[p] > 0 {
		s.gap(p, t.UnixNano(), start)
	}
	s.left[p] = max(0, s.left[p]-n)
	s.last[p] = t.UnixNano()
}

// gap counts partition p's time without progress until now.
func (s *stalls) gap(p int, now, start int64) {
	since := s.last[p]
	if since == 0 {
		since = start
	}
	if since > 0 && now > since {
		s.longest = max(s.longest, time.Duration(now-since))
	}
}

// finish returns the longest stall of a run that started at start and
// ended at end (unix nanoseconds): partitions with messages left were
// stalled until the end.
func (s *stalls) finish(start, end int64) time.Duration {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.left {
		if s.left[p] > 0 {
			s.gap(p, end, start)
		}
	}
	return s.longest
}
