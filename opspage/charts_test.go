package opspage

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// A minute holding more claims than the chart counts is shown as at least
// the cap: the query reads no more of it.
func TestChartCountsAMinuteUpToItsCap(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	name := testenv.Name(t, "c")
	db.Exec(t, `INSERT INTO `+db.Table("consumers")+` (name) VALUES ($1)`, name)
	db.Exec(t, `INSERT INTO `+db.Table("processed_messages")+` (consumer_id, partition, kafka_offset, message_id, fingerprint, topic)
SELECT (SELECT id FROM `+db.Table("consumers")+` WHERE name = $1), 0, g, 'bulk' || g, decode(repeat('00', 32), 'hex'), 't'
FROM generate_series(1, $2::int) g`, name, claimCap+10)
	s, err := claimsPerMinute(context.Background(), db.Pool, db.Schema, name, time.Now())
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
