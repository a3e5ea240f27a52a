package main

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// recorder follows one run: how many of the backlog's messages are done
// (applied, or recognised as duplicates), when the first and the last were,
// and, in latency runs, each message's time from produce to commit.
type recorder struct {
	want    int64
	done    atomic.Int64
	first   atomic.Int64
	last    atomic.Int64
	batches atomic.Int64
	// foundClaimed counts records a share group delivered again after
	// they were applied, and found claimed; setAside, messages set aside
	// in dead_letters (see messageProgress).
	foundClaimed atomic.Int64
	setAside     atomic.Int64
	doneCh       chan struct{}
	once         sync.Once

	mu        sync.Mutex
	latencies []time.Duration // only when latency is set
	latency   bool

	// halfway, when set, runs once when half of want is done: the run's
	// second half is its steady state, after connections, prepared
	// statements and per-partition buffers exist.
	halfway     func()
	halfwayOnce sync.Once

	// stalls, when set, follows each partition's progress (see stalls).
	stalls *stalls
	// ended, when set (unix nanoseconds), is when a run that did not
	// finish its backlog was stopped: its time runs until then, not until
	// its last commit, or a run that stopped making progress long before
	// its time budget ran out would look fast.
	ended atomic.Int64
}

func newRecorder(want int) *recorder {
	return &recorder{want: int64(want), doneCh: make(chan struct{})}
}

// add records n more messages of partition p done at t (after their
// commit).
func (r *recorder) add(p, n int, t time.Time) {
	if n == 0 {
		return
	}
	r.first.CompareAndSwap(0, t.UnixNano())
	r.stalls.commit(p, n, t, r.first.Load())
	r.last.Store(t.UnixNano())
	done := r.done.Add(int64(n))
	if r.halfway != nil && done >= r.want/2 {
		r.halfwayOnce.Do(r.halfway)
	}
	if done >= r.want {
		r.once.Do(func() { close(r.doneCh) })
	}
}

// start marks the moment the first batch began (before add is called for
// it), so the first batch's own time is counted.
func (r *recorder) start(t time.Time) { r.first.CompareAndSwap(0, t.UnixNano()) }

// earliest moves the run's start back to t when t is earlier: the first
// handler call to end need not be the first to have begun.
func (r *recorder) earliest(t time.Time) {
	n := t.UnixNano()
	for {
		old := r.first.Load()
		if old != 0 && old <= n {
			return
		}
		if r.first.CompareAndSwap(old, n) {
			return
		}
	}
}

func (r *recorder) batch() { r.batches.Add(1) }

func (r *recorder) observe(sent, now time.Time) {
	r.mu.Lock()
	if r.latency {
		r.latencies = append(r.latencies, now.Sub(sent))
	}
	r.mu.Unlock()
}

func (r *recorder) elapsed() time.Duration {
	if end := r.ended.Load(); end != 0 && r.done.Load() < r.want && r.first.Load() != 0 {
		return time.Duration(end - r.first.Load())
	}
	return time.Duration(r.last.Load() - r.first.Load())
}

// stop records that the run stopped at t, its backlog done or not.
func (r *recorder) stop(t time.Time) { r.ended.Store(t.UnixNano()) }

// longestStall is the longest time a partition went without progress
// while it had messages left (0 when not followed).
func (r *recorder) longestStall() time.Duration {
	end := r.ended.Load()
	if end == 0 {
		end = r.last.Load()
	}
	return r.stalls.finish(r.first.Load(), end)
}

// percentile of the recorded latencies (q in [0,1]).
func (r *recorder) percentile(q float64) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.latencies) == 0 {
		return 0
	}
	s := slices.Clone(r.latencies)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
