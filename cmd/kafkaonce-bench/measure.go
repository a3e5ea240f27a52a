package main

import (
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"time"
)

// result is one run of one mode on one cell.
type result struct {
	Mode                  string  `json:"mode"`
	Cell                  cell    `json:"cell"`
	Round                 int     `json:"round"`
	Messages              int64   `json:"messages"`
	Seconds               float64 `json:"seconds"`
	MsgsPerSec            float64 `json:"msgs_per_sec"`
	Batches               int64   `json:"batches"`
	RoundTripsPerMsg      float64 `json:"db_round_trips_per_msg"`
	RoundTripsPerBatch    float64 `json:"db_round_trips_per_batch"`
	OffsetCommitsPerMsg   float64 `json:"offset_commits_per_msg"`
	OffsetCommitsPerBatch float64 `json:"offset_commits_per_batch"`
	AllocsPerMsg          float64 `json:"allocs_per_msg"`
	BytesPerMsg           float64 `json:"bytes_per_msg"`
	// The same over the run's second half only: the steady state, without
	// the one-time costs of starting (connections, prepared statements,
	// per-partition buffers and windows filling up).
	SteadyAllocsPerMsg       float64 `json:"steady_allocs_per_msg"`
	SteadyBytesPerMsg        float64 `json:"steady_bytes_per_msg"`
	SteadyRoundTripsPerBatch float64 `json:"steady_db_round_trips_per_batch"`
	SteadyMsgsPerSec         float64 `json:"steady_msgs_per_sec"`
	PeakRSSMiB               float64 `json:"peak_rss_mib"`
	// MaxStallSec is the longest time any partition went without progress
	// while it had messages left (see stalls); 0 where not measured.
	MaxStallSec float64 `json:"max_stall_sec,omitempty"`
	Correct     string  `json:"correct"` // how the run's effect was checked
	// FoundClaimed counts the records a share group delivered again after
	// they were applied (see messageProgress); SetAside, the messages set
	// aside in dead_letters. Counted in the share cells only.
	FoundClaimed int64 `json:"found_claimed,omitempty"`
	SetAside     int64 `json:"set_aside,omitempty"`
	// Latency runs only.
	LoadMsgsPerSec float64 `json:"load_msgs_per_sec,omitempty"`
	P50ms          float64 `json:"p50_ms,omitempty"`
	P99ms          float64 `json:"p99_ms,omitempty"`
}

// snapshot is the process-wide counters at the start of a run, and again
// when half of its messages are done.
type snapshot struct {
	mallocs, bytes uint64
	half           *counters
}

// counters is what the second half of a run is measured from.
type counters struct {
	mallocs, bytes, done, batches, roundTrips int64
	at                                        time.Time
}

func takeSnapshot(e *env, rec *recorder) *snapshot {
	runtime.GC()
	debug.FreeOSMemory()
	resetPeakRSS()
	e.wire.reset()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := &snapshot{mallocs: ms.Mallocs, bytes: ms.TotalAlloc}
	rec.halfway = func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		s.half = &counters{mallocs: int64(ms.Mallocs), bytes: int64(ms.TotalAlloc), done: rec.done.Load(),
			batches: rec.batches.Load(), roundTrips: e.wire.pgRoundTrips.Load(), at: time.Now()}
	}
	return s
}

// finish fills the per-message figures of r from what changed since s.
func (s *snapshot) finish(e *env, r *result, rec *recorder) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	n := float64(rec.done.Load())
	r.Messages = rec.done.Load()
	r.Seconds = rec.elapsed().Seconds()
	r.Batches = rec.batches.Load()
	if r.Seconds > 0 {
		r.MsgsPerSec = n / r.Seconds
	}
	if n > 0 {
		r.RoundTripsPerMsg = float64(e.wire.pgRoundTrips.Load()) / n
		r.OffsetCommitsPerMsg = float64(e.wire.offsetCommits.Load()) / n
		r.AllocsPerMsg = float64(ms.Mallocs-s.mallocs) / n
		r.BytesPerMsg = float64(ms.TotalAlloc-s.bytes) / n
	}
	if r.Batches > 0 {
		r.RoundTripsPerBatch = float64(e.wire.pgRoundTrips.Load()) / float64(r.Batches)
		r.OffsetCommitsPerBatch = float64(e.wire.offsetCommits.Load()) / float64(r.Batches)
	}
	rec.halfwayOnce.Do(func() {}) // a halfway still to come would race with the reads below
	if h := s.half; h != nil {
		if n := rec.done.Load() - h.done; n > 0 {
			r.SteadyAllocsPerMsg = float64(int64(ms.Mallocs)-h.mallocs) / float64(n)
			r.SteadyBytesPerMsg = float64(int64(ms.TotalAlloc)-h.bytes) / float64(n)
		}
		if d := time.Unix(0, rec.last.Load()).Sub(h.at).Seconds(); d > 0 {
			r.SteadyMsgsPerSec = float64(rec.done.Load()-h.done) / d
		}
		if b := rec.batches.Load() - h.batches; b > 0 {
			r.SteadyRoundTripsPerBatch = float64(e.wire.pgRoundTrips.Load()-h.roundTrips) / float64(b)
		}
	}
	r.PeakRSSMiB = float64(peakRSS()) / (1 << 20)
	r.MaxStallSec = rec.longestStall().Seconds()
	r.FoundClaimed, r.SetAside = rec.foundClaimed.Load(), rec.setAside.Load()
	if rec.latency {
		r.P50ms = float64(rec.percentile(0.50)) / float64(time.Millisecond)
		r.P99ms = float64(rec.percentile(0.99)) / float64(time.Millisecond)
	}
}

// resetPeakRSS resets the kernel's high-water mark of this process's
// resident memory (Linux: "5" to clear_refs), so each run reports its own.
func resetPeakRSS() { _ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) }

// peakRSS is VmHWM in bytes, or 0 where /proc is not there.
func peakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("VmHWM:")); ok {
			f := bytes.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(string(f[0]), 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
