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

// A minute holding more claims than the chart counts is shown as at least
// the cap: the query reads no more of it.
func TestServeChartCountsAMinuteUpToItsCap(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(1, "a")
	w.consume(nil, 1)
	w.db.Exec(t, `INSERT INTO `+w.db.Table("processed_messages")+` (consumer_id, partition, kafka_offset, message_id, fingerprint, topic)
SELECT (SELECT id FROM `+w.db.Table("consumers")+` WHERE name = $1), 0, g, 'bulk' || g, decode(repeat('00', 32), 'hex'), $2
FROM generate_series(1, $3::int) g`, w.name, w.topic, claimCap+10)
	s, err := claimsPerMinute(context.Background(), w.db.Pool, w.db.Schema, w.name, time.Now())
	require.NoError(t, err)
	require.EqualValues(t, claimCap, s.counts[len(s.counts)-1])
	require.True(t, s.capped[len(s.capped)-1])
	html := string(chart(s, "claims per minute", "last hour"))
	require.Contains(t, html, fmt.Sprintf("%d or more in the latest", claimCap))
	require.Contains(t, html, "at least ")
}

func TestChartDrawsEveryBucketWithoutStyle(t *testing.T) {
	t.Parallel()
	s := newSeries(time.Date(2026, 5, 1, 12, 30, 20, 0, time.UTC), time.Minute, claimMinutes)
	for i := range s.counts {
		s.counts[i] = int64(i)
	}
	svg := string(chart(s, "claims per minute", "last <hour>"))
	require.True(t, strings.HasPrefix(svg, `<svg class="chart"`), svg)
	require.Equal(t, claimMinutes-1, strings.Count(svg, "<rect "), "a bar per minute that holds claims")
	require.Contains(t, svg, "since 11:31 UTC")
	require.Contains(t, svg, "1770 in all; at most 59 in one; 59 in the latest")
	require.Contains(t, svg, "last &lt;hour&gt;", "the words are escaped")
	require.NotContains(t, svg, "style=", "the page's policy allows no inline style")
}
