package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// The charts come from what Postgres holds: a page started after the
// consumer ran shows its claims per minute, and the letters per class, on
// its first request; there is nothing to wait for and nothing a restart
// loses.
func TestServeChartsClaimsAndLettersFromPostgresAtOnce(t *testing.T) {
	t.Parallel()
	w := newPoisoned(t)
	srv := w.servePage(w.env(), serveOptions{})
	_, body := get(t, srv, "/")
	require.Contains(t, body, `<svg class="chart"`)
	require.Contains(t, body, "claims per minute, last hour")
	require.Contains(t, body, "5 in all", "the five messages claimed (three applied, two dead-lettered) are in the chart")
	require.Contains(t, body, "letters of class permanent per hour, last 24 hours")
	require.Contains(t, body, "2 in all")
	require.NotContains(t, body, "or more")
	require.Contains(t, body, "ids: <code>header:message-id</code>")
	host, _ := os.Hostname()
	require.Contains(t, body, fmt.Sprintf("recorded by %s (pid %d), which joined its group ", host, os.Getpid()))

	// A second page, as after a restart of serve, shows the same.
	_, again := get(t, w.servePage(w.env(), serveOptions{}), "/")
	require.Contains(t, again, "5 in all")
}
