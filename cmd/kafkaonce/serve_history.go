package main

import (
	"context"
	"fmt"
	"html/template"
	"strings"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/consumerstatus"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

// The page's history: each consumer's lag and processed position sampled
// by serve's own process, every historyEvery, for the last historySpan.
const (
	historyEvery = time.Minute
	historySpan  = time.Hour
)

// sample is one reading of a consumer: its total lag, and the sum of its
// stored positions (what it has processed: the difference between two
// samples is what it committed in between). known is false when Kafka's
// side could not be read (lag unknown).
type sample struct {
	at        time.Time
	lag       int64
	processed int64
	known     bool
}

// history keeps each consumer's samples of the last historySpan.
type history struct {
	mu  sync.Mutex
	per map[string][]sample
}

func (h *history) add(name string, s sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.per == nil {
		h.per = map[string][]sample{}
	}
	kept := h.per[name]
	for len(kept) > 0 && s.at.Sub(kept[0].at) > historySpan {
		kept = kept[1:]
	}
	h.per[name] = append(kept, s)
}

func (h *history) of(name string) []sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]sample(nil), h.per[name]...)
}

// sampleOf reads what the chart shows of a status report.
func sampleOf(r statusReport, at time.Time) sample {
	s := sample{at: at, known: len(r.KafkaProblems()) == 0}
	for _, p := range r.Partitions {
		s.lag += max(p.Lag, 0)
		s.processed += max(p.Stored, 0)
	}
	return s
}

// sampleAll samples every consumer of the schema once.
func (p *page) sampleAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	names, err := p.positions.Consumers(ctx, p.c.pool)
	if err != nil {
		p.log.Warn("history: cannot list the consumers", "error", p.redact(err))
		return
	}
	records, _ := p.s.loadRecords(ctx, p.c.pool)
	recordOf := map[string]*recorded.Settings{}
	for i := range records {
		recordOf[records[i].Consumer] = &records[i]
	}
	now := time.Now()
	for _, name := range names {
		rec := recordOf[name]
		r, err := consumerstatus.Read(ctx, p.c.pool, p.c.admin, p.s.schema, name, groupOf(p.o.groups[name], rec, name), rec, nil)
		if err != nil {
			continue // the page says why when it is asked
		}
		p.history.add(name, sampleOf(r, now))
	}
}

// sampleEvery samples every consumer now and then every historyEvery until
// ctx ends.
func (p *page) sampleEvery(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		p.sampleAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// chart draws a consumer's samples as an inline SVG (the page runs no
// script, and its policy allows no inline style): lag as a line, and what
// was committed between samples as bars, each scaled to its own maximum,
// with the latest values in the caption.
func chart(samples []sample) template.HTML {
	if len(samples) < 2 {
		return template.HTML(`<p class="hint">lag and commits over the last hour: the page samples every minute; the chart starts after two samples</p>`)
	}
	const w, h = 600, 80
	first, last := samples[0].at, samples[len(samples)-1].at
	span := max(last.Sub(first).Seconds(), 1)
	x := func(t time.Time) float64 { return t.Sub(first).Seconds() / span * w }
	var maxLag, maxCommits int64 = 1, 1
	commits := make([]int64, len(samples))
	for i, s := range samples {
		maxLag = max(maxLag, s.lag)
		if i > 0 {
			commits[i] = max(s.processed-samples[i-1].processed, 0)
			maxCommits = max(maxCommits, commits[i])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" preserveAspectRatio="none" role="img" aria-label="lag and commits over the last hour">`, w, h)
	barW := max(float64(w)/float64(len(samples))*0.6, 1)
	for i := 1; i < len(samples); i++ {
		bh := float64(commits[i]) / float64(maxCommits) * (h - 4)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#9ab7e6"/>`, x(samples[i].at)-barW, h-bh, barW, bh)
	}
	var pts []string
	for _, s := range samples {
		if s.known {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at), h-2-float64(s.lag)/float64(maxLag)*(h-4)))
		}
	}
	if len(pts) > 1 {
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="#b3261e" stroke-width="2" vector-effect="non-scaling-stroke"/>`, strings.Join(pts, " "))
	}
	b.WriteString(`</svg>`)
	end := samples[len(samples)-1]
	fmt.Fprintf(&b, `<p class="chart-caption">last %s: lag (line) now %d, at most %d; commits (bars) %d in the last interval, at most %d</p>`,
		last.Sub(first).Round(time.Minute), end.lag, maxLag, commits[len(commits)-1], maxCommits)
	return template.HTML(b.String())
}
