package opspage

import (
	"context"
	"fmt"
	"html/template"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// The charts count what Postgres already holds, at request time: each
// claim's processed_at and each letter's dead_lettered_at. A page that
// starts, or restarts, shows the last hour at once.
//
// A count is bounded per bucket (a minute of one consumer's claims, an
// hour of one consumer's letters) by a LIMIT, so that a consumer applying
// far more than the cap, or a flood of letters, costs at most
// buckets × cap index entries. Measured on tables of a million rows
// (docs/operations.md, serve, "Charts"): a consumer whose whole million
// claims fell in the last hour, 220 ms; one whose million spread over ten
// days, 1.4 ms; a day of 250,000 letters, 70 ms.
const (
	claimMinutes = 60
	claimCap     = 10_000
	letterHours  = 24
	letterCap    = 1_000
)

// series is a count per bucket, the first starting at start.
type series struct {
	start  time.Time
	step   time.Duration
	counts []int64
	// capped marks a bucket whose count reached the cap: at least that.
	capped []bool
}

func newSeries(now time.Time, step time.Duration, n int) series {
	end := now.Truncate(step)
	return series{start: end.Add(-time.Duration(n-1) * step), step: step, counts: make([]int64, n), capped: make([]bool, n)}
}

// starts are the buckets' beginnings, as the queries take them.
func (s series) starts() []time.Time {
	out := make([]time.Time, len(s.counts))
	for i := range out {
		out[i] = s.start.Add(time.Duration(i) * s.step)
	}
	return out
}

// claimsPerMinute counts a consumer's claims in each of the last
// claimMinutes minutes, through the (consumer_id, processed_at) index.
func claimsPerMinute(ctx context.Context, pool *pgxpool.Pool, schemaName, consumerName string, now time.Time) (series, error) {
	s := newSeries(now, time.Minute, claimMinutes)
	// unnest of a parameter is estimated at a few rows, where
	// generate_series is at a thousand: the plan stays cheap enough not
	// to be compiled (JIT costs more than the query).
	rows, err := pool.Query(ctx, `SELECT m.i, (SELECT count(*) FROM (SELECT 1 FROM `+schema.Table(schemaName, "processed_messages")+` p
    WHERE p.consumer_id = c.id AND p.processed_at >= m.at AND p.processed_at < m.at + $3::interval LIMIT $4) x)
FROM `+schema.Table(schemaName, "consumers")+` c, unnest($2::timestamptz[]) WITH ORDINALITY AS m(at, i)
WHERE c.name = $1`, consumerName, s.starts(), s.step, claimCap)
	if err != nil {
		return s, fmt.Errorf("claims per minute: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var i, n int64
		if err := rows.Scan(&i, &n); err != nil {
			return s, fmt.Errorf("claims per minute: %w", err)
		}
		s.counts[i-1], s.capped[i-1] = n, n >= claimCap
	}
	if err := rows.Err(); err != nil {
		return s, fmt.Errorf("claims per minute: %w", err)
	}
	return s, nil
}

// classSeries is the letters of one class per hour.
type classSeries struct {
	class string
	series
}

// lettersPerClass counts the letters of the consumers in each of the last
// letterHours hours, by class, through the (consumer, dead_lettered_at)
// index. The ORDER BY, which the index gives for free, makes the plan an
// index scan that stops at the LIMIT: without it Postgres reads the whole
// hour through a bitmap before the LIMIT applies.
func lettersPerClass(ctx context.Context, pool *pgxpool.Pool, schemaName string, consumers []string, now time.Time) ([]classSeries, error) {
	base := newSeries(now, time.Hour, letterHours)
	rows, err := pool.Query(ctx, `SELECT h.i, c.name, d.error_class, count(*)
FROM unnest($1::text[]) AS c(name), unnest($2::timestamptz[]) WITH ORDINALITY AS h(at, i),
LATERAL (SELECT l.error_class FROM `+schema.Table(schemaName, "dead_letters")+` l
    WHERE l.consumer = c.name AND l.dead_lettered_at >= h.at AND l.dead_lettered_at < h.at + $3::interval
    ORDER BY l.dead_lettered_at LIMIT $4) d
GROUP BY 1, 2, 3`, consumers, base.starts(), base.step, letterCap)
	if err != nil {
		return nil, fmt.Errorf("letters per class: %w", err)
	}
	defer rows.Close()
	byClass := map[string]*classSeries{}
	type bucket struct {
		i        int64
		consumer string
	}
	read := map[bucket]int64{}
	for rows.Next() {
		var b bucket
		var class string
		var n int64
		if err := rows.Scan(&b.i, &b.consumer, &class, &n); err != nil {
			return nil, fmt.Errorf("letters per class: %w", err)
		}
		cs := byClass[class]
		if cs == nil {
			cs = &classSeries{class: class, series: newSeries(now, time.Hour, letterHours)}
			byClass[class] = cs
		}
		cs.counts[b.i-1] += n
		read[b] += n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("letters per class: %w", err)
	}
	// A consumer's hour that reached the cap was cut short, in whichever
	// classes it holds: each of them shows "at least".
	for b, n := range read {
		if n >= letterCap {
			for _, cs := range byClass {
				cs.capped[b.i-1] = true
			}
		}
	}
	out := make([]classSeries, 0, len(byClass))
	for _, cs := range byClass {
		out = append(out, *cs)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].class < out[j].class })
	return out, nil
}

// chart draws a series as an inline SVG of bars (the page runs no script,
// and its policy allows no inline style), scaled to its largest bucket,
// with what it shows in the caption. what names a bucket's count ("claims
// per minute"), over its span ("last hour").
func chart(s series, what, over string) template.HTML {
	const w, h = 600, 60
	var total, most int64
	cut := false
	for i, n := range s.counts {
		total += n
		most = max(most, n)
		cut = cut || s.capped[i]
	}
	what, over = template.HTMLEscapeString(what), template.HTMLEscapeString(over)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" preserveAspectRatio="none" role="img" aria-label="%s, %s">`, w, h, what, over)
	barW := float64(w) / float64(len(s.counts))
	for i, n := range s.counts {
		if n == 0 {
			continue
		}
		bh := max(float64(n)/float64(most)*(h-2), 1)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#9ab7e6"><title>%s: %d%s</title></rect>`,
			float64(i)*barW+barW*0.1, h-bh, barW*0.8, bh, s.start.Add(time.Duration(i)*s.step).UTC().Format("15:04Z"), n, orMore(s.capped[i]))
	}
	b.WriteString(`</svg>`)
	atLeast := ""
	if cut {
		atLeast = "at least "
	}
	last := len(s.counts) - 1
	fmt.Fprintf(&b, `<p class="chart-caption">%s, %s (since %s UTC): %s%d in all; at most %d in one; %d%s in the latest</p>`,
		what, over, s.start.UTC().Format("15:04"), atLeast, total, most, s.counts[last], orMore(s.capped[last]))
	return template.HTML(b.String())
}

// orMore marks a count that reached its cap.
func orMore(capped bool) string {
	if capped {
		return " or more"
	}
	return ""
}
