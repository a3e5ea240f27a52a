package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// progress draws a progress bar on an interactive terminal, and nothing
// otherwise (logs and pipes get only the result).
type progress struct {
	w          io.Writer
	label      string
	on         bool
	total, now int64
	drawn      time.Time
}

func newProgress(st streams, label string) *progress {
	return &progress{w: st.err, label: label, on: st.terminal()}
}

func (p *progress) start(total int64) { p.total, p.now = total, 0; p.draw(true) }

func (p *progress) add(n int64) {
	p.now += n
	p.draw(false)
}

func (p *progress) draw(force bool) {
	if !p.on || !force && time.Since(p.drawn) < 100*time.Millisecond {
		return
	}
	p.drawn = time.Now()
	frac := 1.0
	if p.total > 0 {
		frac = min(float64(p.now)/float64(p.total), 1)
	}
	const width = 30
	filled := int(frac * width)
	fmt.Fprintf(p.w, "\r%s [%s%s] %3.0f%% %d/%d", p.label, strings.Repeat("#", filled), strings.Repeat(" ", width-filled), frac*100, p.now, p.total)
}

func (p *progress) done() {
	if p.on {
		p.draw(true)
		fmt.Fprintln(p.w)
	}
}
