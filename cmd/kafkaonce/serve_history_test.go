package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The page samples each consumer itself and charts its lag and commits
// over the last hour, with the id rule it records beside them.
func TestServeChartsLagAndCommits(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(10, "a")
	w.consume(nil, 5)
	p, srv := w.servePageOf(w.env(), serveOptions{})
	_, body := get(t, srv, "/")
	require.Contains(t, body, "the chart starts after two samples")
	require.Contains(t, body, "ids: <code>header:message-id</code>")
	host, _ := os.Hostname()
	require.Contains(t, body, fmt.Sprintf("recorded by %s (pid %d), which joined its group ", host, os.Getpid()))

	ctx := context.Background()
	p.sampleAll(ctx)
	w.produce(10, "b")
	w.consume(nil, 10)
	p.sampleAll(ctx)
	_, body = get(t, srv, "/")
	require.Contains(t, body, `<svg class="chart"`)
	require.Contains(t, body, "<rect ", "a bar for the commits between the samples")
	require.Contains(t, body, "commits (bars) 10 in the last interval")
	require.Contains(t, body, "lag (line) now 0")
}

func TestHistoryKeepsTheLastHour(t *testing.T) {
	t.Parallel()
	var h history
	start := time.Now()
	for i := range 120 {
		h.add("c", sample{at: start.Add(time.Duration(i) * time.Minute), processed: int64(i)})
	}
	got := h.of("c")
	require.LessOrEqual(t, got[len(got)-1].at.Sub(got[0].at), historySpan)
	require.Len(t, got, 61)
	require.Empty(t, h.of("other"))

	svg := string(chart(got))
	require.True(t, strings.HasPrefix(svg, `<svg class="chart"`), svg)
	require.Contains(t, svg, "last 1h0m0s")
	require.NotContains(t, svg, "style=", "the page's policy allows no inline style")
}
