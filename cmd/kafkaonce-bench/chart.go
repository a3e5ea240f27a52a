package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// writeChart draws two panels as SVG: messages per second by mode for each
// effect (base cell otherwise), and by batch size for optimum and kafkaonce.
// Both use a log scale: the modes span three orders of magnitude.
func (rep *report) writeChart(path string) error {
	const w, h, pad = 980, 420, 60
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", w, h)
	fmt.Fprintf(&sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)

	// Shared log axis from 100 to the largest value.
	top := 100.0
	for _, r := range rep.rows {
		top = math.Max(top, r.Median.MsgsPerSec)
	}
	top = math.Pow(10, math.Ceil(math.Log10(top)))
	y := func(v float64) float64 {
		v = math.Max(v, 100)
		return float64(h-pad) - (math.Log10(v)-2)/(math.Log10(top)-2)*float64(h-2*pad)
	}
	axis := func(x0, x1 float64, title string) {
		fmt.Fprintf(&sb, `<text x="%.0f" y="24" font-size="14" font-weight="bold">%s</text>`+"\n", x0, title)
		for v := 100.0; v <= top; v *= 10 {
			fmt.Fprintf(&sb, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, x1, y(v), y(v))
			fmt.Fprintf(&sb, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-4, y(v)+4, humanize(v))
		}
		fmt.Fprintf(&sb, `<text x="%.0f" y="%d" text-anchor="middle" transform="rotate(-90 %.0f %d)">messages/s (log)</text>`+"\n", x0-44, h/2, x0-44, h/2)
	}
	colors := map[string]string{"raw": "#999999", "naive-1": "#d62728", "naive-pp": "#ff7f0e", "optimum": "#1f77b4", "kafkaonce": "#2ca02c", "kafkaonce-batch": "#17becf", "kafkaonce-keys": "#9467bd"}

	// Panel 1: by mode and effect.
	x0, x1 := float64(pad+20), float64(w/2-10)
	axis(x0, x1, "Throughput by mode (12 partitions, UUIDv7, batch 1000)")
	effects := []effect{effectNoop, effectUpdate, effectWait}
	modes := []string{"raw", "naive-1", "naive-pp", "optimum", "kafkaonce", "kafkaonce-batch", "kafkaonce-keys"}
	groupW := (x1 - x0) / float64(len(effects))
	barW := groupW / float64(len(modes)+1)
	for gi, ef := range effects {
		c := base
		c.Effect = ef
		gx := x0 + float64(gi)*groupW
		fmt.Fprintf(&sb, `<text x="%.0f" y="%d" text-anchor="middle">%s</text>`+"\n", gx+groupW/2, h-pad+18, ef)
		for mi, m := range modes {
			r, ok := rep.find(m, c)
			if !ok {
				continue
			}
			bx := gx + barW/2 + float64(mi)*barW
			fmt.Fprintf(&sb, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %.0f msgs/s</title></rect>`+"\n",
				bx, y(r.MsgsPerSec), barW-2, float64(h-pad)-y(r.MsgsPerSec), colors[m], m, ef, r.MsgsPerSec)
		}
	}
	for mi, m := range modes {
		lx := x0 + float64(mi)*(x1-x0)/float64(len(modes))
		fmt.Fprintf(&sb, `<rect x="%.0f" y="%d" width="10" height="10" fill="%s"/><text x="%.0f" y="%d">%s</text>`+"\n", lx, h-22, colors[m], lx+14, h-13, m)
	}

	// Panel 2: by batch size.
	x0, x1 = float64(w/2+pad), float64(w-20)
	axis(x0, x1, "Throughput by batch size (one UPDATE per message)")
	sizes := []int{1, 10, 100, 1000}
	xs := func(i int) float64 { return x0 + 20 + float64(i)*(x1-x0-40)/float64(len(sizes)-1) }
	for i, s := range sizes {
		fmt.Fprintf(&sb, `<text x="%.0f" y="%d" text-anchor="middle">%d</text>`+"\n", xs(i), h-pad+18, s)
	}
	fmt.Fprintf(&sb, `<text x="%.0f" y="%d" text-anchor="middle">max batch (messages)</text>`+"\n", (x0+x1)/2, h-pad+36)
	for _, m := range []string{"optimum", "kafkaonce", "kafkaonce-batch"} {
		var pts []string
		for i, s := range sizes {
			c := base
			c.MaxBatch = s
			if r, ok := rep.find(m, c); ok {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xs(i), y(r.MsgsPerSec)))
				fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"><title>%s batch %d: %.0f msgs/s</title></circle>`+"\n", xs(i), y(r.MsgsPerSec), colors[m], m, s, r.MsgsPerSec)
			}
		}
		if len(pts) > 1 {
			fmt.Fprintf(&sb, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(pts, " "), colors[m])
		}
	}
	sb.WriteString("</svg>\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

func humanize(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%gk", v/1e3)
	}
	return fmt.Sprintf("%g", v)
}
