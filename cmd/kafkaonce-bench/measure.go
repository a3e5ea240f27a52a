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
	PeakRSSMiB            float64 `json:"peak_rss_mib"`
	Correct               string  `json:"correct"` // how the run's effect was checked
	// Latency runs only.
	LoadMsgsPerSec float64 `json:"load_msgs_per_sec,omitempty"`
	P50ms          float64 `json:"p50_ms,omitempty"`
	P99ms          float64 `json:"p99_ms,omitempty"`
}

// snapshot is the process-wide counters at the start of a run.
type snapshot struct {
	mallocs, bytes uint64
}

func takeSnapshot(e *env) snapshot {
	runtime.GC()
	debug.FreeOSMemory()
	resetPeakRSS()
	e.wire.reset()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return snapshot{mallocs: ms.Mallocs, bytes: ms.TotalAlloc}
}

// finish fills the per-message figures of r from what changed since s.
func (s snapshot) finish(e *env, r *result, rec *recorder) {
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
	r.PeakRSSMiB = float64(peakRSS()) / (1 << 20)
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
