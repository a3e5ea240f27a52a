package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// report aggregates the runs: the median of the rounds per mode and cell.
type report struct {
	results []result
	rows    []row
	env     *env
	o       options
	when    time.Time
	// machineDesc replaces the description of this machine when the report
	// is rebuilt from a saved run (-from).
	machineDesc string
}

// row is the median over rounds of one mode on one cell.
type row struct {
	Mode   string
	Cell   cell
	Runs   int
	Median result
}

func newReport(results []result, e *env, o options) *report {
	rep := &report{results: results, env: e, o: o, when: time.Now().UTC()}
	type key struct {
		mode string
		c    cell
	}
	var order []key
	groups := map[key][]result{}
	for _, r := range results {
		k := key{r.Mode, r.Cell}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	for _, k := range order {
		rs := groups[k]
		m := rs[0]
		med := func(f func(result) float64) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r)
			}
			return medianOf(v)
		}
		m.MsgsPerSec = med(func(r result) float64 { return r.MsgsPerSec })
		m.RoundTripsPerMsg = med(func(r result) float64 { return r.RoundTripsPerMsg })
		m.RoundTripsPerBatch = med(func(r result) float64 { return r.RoundTripsPerBatch })
		m.OffsetCommitsPerMsg = med(func(r result) float64 { return r.OffsetCommitsPerMsg })
		m.OffsetCommitsPerBatch = med(func(r result) float64 { return r.OffsetCommitsPerBatch })
		m.AllocsPerMsg = med(func(r result) float64 { return r.AllocsPerMsg })
		m.BytesPerMsg = med(func(r result) float64 { return r.BytesPerMsg })
		m.SteadyAllocsPerMsg = med(func(r result) float64 { return r.SteadyAllocsPerMsg })
		m.SteadyBytesPerMsg = med(func(r result) float64 { return r.SteadyBytesPerMsg })
		m.SteadyRoundTripsPerBatch = med(func(r result) float64 { return r.SteadyRoundTripsPerBatch })
		m.SteadyMsgsPerSec = med(func(r result) float64 { return r.SteadyMsgsPerSec })
		m.PeakRSSMiB = med(func(r result) float64 { return r.PeakRSSMiB })
		m.MaxStallSec = med(func(r result) float64 { return r.MaxStallSec })
		for _, r := range rs {
			if r.Correct != m.Correct {
				m.Correct = "mixed"
			}
		}
		rep.rows = append(rep.rows, row{Mode: k.mode, Cell: k.c, Runs: len(rs), Median: m})
	}
	return rep
}

func (rep *report) find(mode string, c cell) (result, bool) {
	for _, r := range rep.rows {
		if r.Mode == mode && r.Cell == c {
			return r.Median, true
		}
	}
	return result{}, false
}

// cells in the order they were first run.
func (rep *report) cells() []cell {
	var cs []cell
	for _, r := range rep.rows {
		if !slices.Contains(cs, r.Cell) && !strings.Contains(r.Mode, "@") && !strings.Contains(r.Mode, "backlog") {
			cs = append(cs, r.Cell)
		}
	}
	return cs
}

func (rep *report) printTable(w io.Writer) {
	tabulate := func(table func(func([]string))) {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		table(func(cols []string) { fmt.Fprintln(tw, strings.Join(cols, "\t")+"\t") })
		tw.Flush()
	}
	tabulate(rep.table)
	if rep.hasHot() {
		fmt.Fprintln(w, "\nHot rows:")
		tabulate(rep.hotTable)
	}
}

var tableHeader = []string{"cell", "mode", "msgs/s", "× optimum", "DB RT/batch", "DB RT/batch 2nd half", "DB RT/msg", "offset commits/batch",
	"allocs/msg 2nd half", "bytes/msg 2nd half", "bytes/msg whole run", "peak RSS MiB", "p50 ms", "p99 ms", "longest stall s", "effect check"}

// table emits the header and one line per row: throughput rows by cell,
// then latency and memory rows. Allocations and bytes are beyond raw
// kafka-go fetching of the same cell; "2nd half" columns count only the
// second half of each run's messages (the steady state).
func (rep *report) table(emit func([]string)) {
	emit(tableHeader)
	for _, c := range rep.cells() {
		opt, hasOpt := rep.find("optimum", c)
		raw, hasRaw := rep.find("raw", c)
		for _, r := range rep.rows {
			if r.Cell != c || strings.Contains(r.Mode, "@") || strings.Contains(r.Mode, "backlog") {
				continue
			}
			m := r.Median
			ratio := "-"
			if hasOpt && opt.MsgsPerSec > 0 {
				ratio = fmt.Sprintf("%.2f", m.MsgsPerSec/opt.MsgsPerSec)
			}
			allocs, bytes, whole := fmt.Sprintf("%.1f", m.SteadyAllocsPerMsg), fmt.Sprintf("%.0f", m.SteadyBytesPerMsg), fmt.Sprintf("%.0f", m.BytesPerMsg)
			if hasRaw && r.Mode != "raw" {
				allocs = fmt.Sprintf("%+.1f", m.SteadyAllocsPerMsg-raw.SteadyAllocsPerMsg)
				bytes = fmt.Sprintf("%+.0f", m.SteadyBytesPerMsg-raw.SteadyBytesPerMsg)
				whole = fmt.Sprintf("%+.0f", m.BytesPerMsg-raw.BytesPerMsg)
			}
			emit([]string{c.String(), r.Mode, fmt.Sprintf("%.0f", m.MsgsPerSec), ratio,
				fmt.Sprintf("%.2f", m.RoundTripsPerBatch), fmt.Sprintf("%.2f", m.SteadyRoundTripsPerBatch),
				fmt.Sprintf("%.3f", m.RoundTripsPerMsg), fmt.Sprintf("%.2f", m.OffsetCommitsPerBatch),
				allocs, bytes, whole, fmt.Sprintf("%.0f", m.PeakRSSMiB), "-", "-", stallText(m), m.Correct})
		}
	}
	for _, r := range rep.rows {
		if !strings.Contains(r.Mode, "@") && !strings.Contains(r.Mode, "backlog") {
			continue
		}
		m := r.Median
		p50, p99 := "-", "-"
		if m.P99ms > 0 {
			p50, p99 = fmt.Sprintf("%.1f", m.P50ms), fmt.Sprintf("%.1f", m.P99ms)
		}
		desc := r.Cell.String()
		if m.LoadMsgsPerSec > 0 {
			desc += fmt.Sprintf(" load=%.0f/s", m.LoadMsgsPerSec)
		}
		if strings.HasSuffix(r.Mode, "@capacity") {
			// A ramp's result: the rate it kept up with, nothing counted.
			emit(append([]string{desc, r.Mode, fmt.Sprintf("%.0f", m.MsgsPerSec)}, slices.Repeat([]string{"-"}, len(tableHeader)-3)...))
			continue
		}
		emit([]string{desc, r.Mode, fmt.Sprintf("%.0f", m.MsgsPerSec), "-", fmt.Sprintf("%.2f", m.RoundTripsPerBatch), "-",
			fmt.Sprintf("%.3f", m.RoundTripsPerMsg), fmt.Sprintf("%.2f", m.OffsetCommitsPerBatch), "-", "-", "-",
			fmt.Sprintf("%.0f", m.PeakRSSMiB), p50, p99, "-", m.Correct})
	}
}

// stallText is a run's longest stall, or "-" where it was not measured
// (latency runs, results saved before it was).
func stallText(m result) string {
	if m.MaxStallSec == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", m.MaxStallSec)
}

// summary is the last line: the key ratios, each on the base cell (one
// UPDATE per message, 12 partitions) unless named otherwise, and the worst
// kafkaonce/optimum ratio over every cell run.
type summary struct {
	VsOptimum        float64 `json:"vs_optimum"`
	VsOptimumHandler float64 `json:"vs_optimum_per_message_handler"`
	VsOptimumWorst   float64 `json:"vs_optimum_worst_cell"`
	// The worst over the cells with the base cell's batch size: the axes
	// of the issue (partitions, table, ids, duplicates, effect, size),
	// without the smaller batches, which are an axis of our own.
	VsOptimumWorstFullBatch float64 `json:"vs_optimum_worst_cell_full_batch,omitempty"`
	VsNaive                 float64 `json:"vs_naive"`
	VsNaivePerPartition     float64 `json:"vs_naive_per_partition"`
	MsgsPerSec              float64 `json:"msgs_per_sec"`
	MsgsPerSecUpdate        float64 `json:"msgs_per_sec_update"`
	RoundTripsPerBatch      float64 `json:"db_round_trips_per_batch"`
	// Over the second half of the run only (see result).
	SteadyRoundTripsPerBatch float64 `json:"steady_db_round_trips_per_batch"`
	CommitsPerBatch          float64 `json:"offset_commits_per_batch"`
	PrefilledVsEmpty         float64 `json:"prefilled_vs_empty,omitempty"`
	P50ms                    float64 `json:"p50_ms,omitempty"`
	P99ms                    float64 `json:"p99_ms,omitempty"`
	PeakRSS10MVs1M           float64 `json:"peak_rss_10m_vs_1m,omitempty"`
	PerKeySpeedup            float64 `json:"per_key_speedup,omitempty"`
	// HotRows has, for each hot-rows cell, its ratios and longest stalls
	// (see hotSummary); hot cells are not in the worst-cell figures, which
	// are about the axes of the issue.
	HotRows map[string]hotSummary `json:"hot_rows,omitempty"`
	// Beyond raw kafka-go fetching, kafkaonce on the no-op cell: the
	// framework's own cost, without a handler's.
	AllocsPerMsg       float64 `json:"allocs_per_msg_beyond_raw"`
	BytesPerMsg        float64 `json:"bytes_per_msg_beyond_raw"`
	SteadyAllocsPerMsg float64 `json:"steady_allocs_per_msg_beyond_raw"`
	SteadyBytesPerMsg  float64 `json:"steady_bytes_per_msg_beyond_raw"`
	// The optimum's latency at half its own capacity, for comparison.
	OptimumP50ms float64 `json:"optimum_p50_ms,omitempty"`
	OptimumP99ms float64 `json:"optimum_p99_ms,omitempty"`
	// The per-message Handler's latency at half its own capacity: each
	// of its messages is a statement of its own.
	HandlerP50ms float64 `json:"handler_p50_ms,omitempty"`
	HandlerP99ms float64 `json:"handler_p99_ms,omitempty"`
	// kafkaonce-batch's capacity, the highest producer rate it keeps up
	// with on this machine (see latencyRuns): the latency runs produce at
	// half of it, and again at half the drain rate.
	CapacityMsgsPerSec float64 `json:"capacity_msgs_per_sec,omitempty"`
	// Latency at half the drain rate (the stricter load), kafkaonce-batch
	// and the optimum.
	DrainP50ms        float64            `json:"drain_p50_ms,omitempty"`
	DrainP99ms        float64            `json:"drain_p99_ms,omitempty"`
	OptimumDrainP50ms float64            `json:"optimum_drain_p50_ms,omitempty"`
	OptimumDrainP99ms float64            `json:"optimum_drain_p99_ms,omitempty"`
	VsOptimumByCell   map[string]float64 `json:"vs_optimum_by_cell"`
}

func (rep *report) summary() summary {
	s := summary{VsOptimumByCell: map[string]float64{}}
	ratio := rep.ratio
	s.VsOptimum = ratio("kafkaonce-batch", "optimum", base)
	s.VsOptimumHandler = ratio("kafkaonce", "optimum", base)
	s.VsNaive = ratio("kafkaonce", "naive-1", base)
	s.VsNaivePerPartition = ratio("kafkaonce", "naive-pp", base)
	s.VsOptimumWorst, s.VsOptimumWorstFullBatch = math.Inf(1), math.Inf(1)
	for _, c := range rep.cells() {
		if r := ratio("kafkaonce-batch", "optimum", c); r > 0 {
			s.VsOptimumByCell[c.String()] = r
			if c.hot() {
				continue
			}
			s.VsOptimumWorst = min(s.VsOptimumWorst, r)
			if c.MaxBatch == base.MaxBatch {
				s.VsOptimumWorstFullBatch = min(s.VsOptimumWorstFullBatch, r)
			}
		}
	}
	for _, v := range []*float64{&s.VsOptimumWorst, &s.VsOptimumWorstFullBatch} {
		if math.IsInf(*v, 1) {
			*v = 0
		}
	}
	noop := base
	noop.Effect = effectNoop
	if k, ok := rep.find("kafkaonce", noop); ok {
		s.MsgsPerSec = math.Round(k.MsgsPerSec)
	}
	if k, ok := rep.find("kafkaonce-batch", base); ok {
		s.MsgsPerSecUpdate = math.Round(k.MsgsPerSec)
		s.RoundTripsPerBatch = round2(k.RoundTripsPerBatch)
		s.SteadyRoundTripsPerBatch = round2(k.SteadyRoundTripsPerBatch)
		s.CommitsPerBatch = round2(k.OffsetCommitsPerBatch)
	}
	pre := base
	pre.Prefilled = true
	if a, ok := rep.find("kafkaonce-batch", pre); ok {
		if b, ok := rep.find("kafkaonce-batch", base); ok && b.MsgsPerSec > 0 {
			s.PrefilledVsEmpty = round2(a.MsgsPerSec / b.MsgsPerSec)
		}
	}
	latency := func(mode string) (p50, p99 float64) {
		if l, ok := rep.find(mode, base); ok {
			return round2(l.P50ms), round2(l.P99ms)
		}
		return 0, 0
	}
	s.P50ms, s.P99ms = latency("kafkaonce-batch@50% " + ofCapacity)
	s.OptimumP50ms, s.OptimumP99ms = latency("optimum@50% " + ofCapacity)
	s.HandlerP50ms, s.HandlerP99ms = latency("kafkaonce@50% " + ofCapacity)
	s.DrainP50ms, s.DrainP99ms = latency("kafkaonce-batch@50% " + ofDrain)
	s.OptimumDrainP50ms, s.OptimumDrainP99ms = latency("optimum@50% " + ofDrain)
	if s.DrainP99ms == 0 {
		// Results saved before capacity runs existed: their latency runs
		// were at half the drain rate, named without saying so.
		s.DrainP50ms, s.DrainP99ms = latency("kafkaonce-batch@50%")
		s.OptimumDrainP50ms, s.OptimumDrainP99ms = latency("optimum@50%")
	}
	if k, ok := rep.find("kafkaonce-batch@capacity", base); ok {
		s.CapacityMsgsPerSec = math.Round(k.MsgsPerSec)
	}
	if k, ok := rep.find("kafkaonce", noop); ok {
		if raw, ok := rep.find("raw", noop); ok {
			s.AllocsPerMsg = round2(k.AllocsPerMsg - raw.AllocsPerMsg)
			s.BytesPerMsg = math.Round(k.BytesPerMsg - raw.BytesPerMsg)
			s.SteadyAllocsPerMsg = round2(k.SteadyAllocsPerMsg - raw.SteadyAllocsPerMsg)
			s.SteadyBytesPerMsg = math.Round(k.SteadyBytesPerMsg - raw.SteadyBytesPerMsg)
		}
	}
	slow := base
	slow.Effect, slow.Partitions = effectWait, 1
	s.PerKeySpeedup = ratio("kafkaonce-keys", "kafkaonce", slow)
	var m1, m10 float64
	for _, r := range rep.rows {
		switch r.Mode {
		case "kafkaonce backlog 1M":
			m1 = r.Median.PeakRSSMiB
		case "kafkaonce backlog 10M":
			m10 = r.Median.PeakRSSMiB
		}
	}
	if m1 > 0 {
		s.PeakRSS10MVs1M = round2(m10 / m1)
	}
	s.HotRows = rep.hotSummaries()
	return s
}

// ratio is mode a's msgs/s over mode b's on cell c to two decimals, 0
// when either was not run.
func (rep *report) ratio(a, b string, c cell) float64 { return round2(rep.exactRatio(a, b, c)) }

// exactRatio is ratio unrounded: on hot rows a mode can be thousands of
// times slower than another, which two decimals would show as 0.
func (rep *report) exactRatio(a, b string, c cell) float64 {
	x, ok1 := rep.find(a, c)
	y, ok2 := rep.find(b, c)
	if !ok1 || !ok2 || y.MsgsPerSec == 0 {
		return 0
	}
	return x.MsgsPerSec / y.MsgsPerSec
}

func (rep *report) writeJSON(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(struct {
		When    time.Time `json:"when"`
		Machine string    `json:"machine"`
		Summary summary   `json:"summary"`
		Runs    []result  `json:"runs"`
	}{rep.when, rep.machine(), rep.summary(), rep.results}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// machine describes where the numbers come from.
func (rep *report) machine() string {
	if rep.machineDesc != "" {
		return rep.machineDesc
	}
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %d kB", &kb)
		mem = fmt.Sprintf(", %d GiB", (kb+(1<<19))>>20)
	}
	return fmt.Sprintf("%d × %s%s, %s/%s, %s; %s; %s", runtime.NumCPU(), cpu, mem, runtime.GOOS, runtime.GOARCH,
		runtime.Version(), rep.env.pgDesc, rep.env.brokerDesc)
}

func round2(f float64) float64 { return math.Round(f*100) / 100 }

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pick returns the msgs/s of every run of a mode on a cell.
func pick(results []result, mode string, c cell) []float64 {
	var v []float64
	for _, r := range results {
		if r.Mode == mode && r.Cell == c {
			v = append(v, r.MsgsPerSec)
		}
	}
	return v
}
