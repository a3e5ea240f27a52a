package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/benchdoc"
)

// section is the part of BENCHMARKS.md this program owns.
const section = "kafkaonce-httpbench"

// results collects the runs: throughput per round, latencies pooled.
type results struct {
	seconds  float64
	rounds   int
	clients  int
	halfRate float64
	tput     map[string][]float64
	lat      map[string][]time.Duration
	when     time.Time
}

func (r *results) add(cell string, tput float64, lat []time.Duration) {
	if r.tput == nil {
		r.tput, r.lat, r.when = map[string][]float64{}, map[string][]time.Duration{}, time.Now().UTC()
	}
	if tput > 0 {
		r.tput[cell] = append(r.tput[cell], tput)
	}
	r.lat[cell] = append(r.lat[cell], lat...)
}

// median is the median throughput of a cell over the rounds.
func (r *results) median(cell string) float64 {
	s := slices.Clone(r.tput[cell])
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	return s[len(s)/2]
}

func (r *results) latency(cell string, p float64) time.Duration {
	s := slices.Clone(r.lat[cell])
	sortDurations(s)
	return percentile(s, p)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// rows is the table: the header, then a row per cell.
func (r *results) rows() [][]string {
	out := [][]string{{"endpoint", "load", "requests/s", "× plain", "p50 ms", "p99 ms"}}
	plain := r.median("plain full")
	for _, c := range []struct{ cell, name, load string }{
		{"plain full", "plain (own transaction, no key)", fmt.Sprintf("%d clients flat out", r.clients)},
		{"keyed full", "behind idempotency (new keys)", fmt.Sprintf("%d clients flat out", r.clients)},
		{"replay full", "replays (keys completed)", fmt.Sprintf("%d clients flat out", r.clients)},
		{"floor full", "no database (HTTP on loopback alone)", fmt.Sprintf("%d clients flat out", r.clients)},
		{"plain half", "plain (own transaction, no key)", fmt.Sprintf("%.0f req/s, half of plain's capacity", r.halfRate)},
		{"keyed half", "behind idempotency (new keys)", fmt.Sprintf("%.0f req/s, half of plain's capacity", r.halfRate)},
	} {
		t, ratio := "-", "-"
		if v := r.median(c.cell); v > 0 {
			t, ratio = fmt.Sprintf("%.0f", v), fmt.Sprintf("%.2f", v/plain)
		}
		out = append(out, []string{c.name, c.load, t, ratio, ms(r.latency(c.cell, 0.5)), ms(r.latency(c.cell, 0.99))})
	}
	return out
}

// targets are the targets with what was measured.
func (r *results) targets() [][]string {
	addedP99 := r.latency("keyed half", 0.99) - r.latency("plain half", 0.99)
	return [][]string{
		{"target", "measured"},
		{"throughput behind the middleware ≥ 0.8 × the same endpoint without keys", fmt.Sprintf("%.2f ×", r.median("keyed full")/r.median("plain full"))},
		{"added p99 ≤ 2 ms at half load", fmt.Sprintf("%s ms (p99 %s ms against %s ms)", ms(addedP99), ms(r.latency("keyed half", 0.99)), ms(r.latency("plain half", 0.99)))},
		{"a replay ≥ 3 × faster than an execution", fmt.Sprintf("%.2f × the throughput; p50 %s ms against %s ms; beyond what HTTP alone costs (p50 %s ms), %.1f × faster",
			r.median("replay full")/r.median("keyed full"), ms(r.latency("replay full", 0.5)), ms(r.latency("keyed full", 0.5)), ms(r.latency("floor full", 0.5)),
			float64(r.latency("keyed full", 0.5)-r.latency("floor full", 0.5))/float64(max(r.latency("replay full", 0.5)-r.latency("floor full", 0.5), time.Microsecond)))},
	}
}

func (r *results) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	for _, table := range [][][]string{r.targets(), r.rows()} {
		for _, row := range table {
			fmt.Fprintln(tw, strings.Join(row, "\t"))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}

// whereTheTimeGoes explains the ratios: why the middleware's throughput
// and a replay's speed-up are bounded on a machine like the one measured.
const whereTheTimeGoes = `Where the time goes. The keyed and the plain endpoint take the same round trips (three: BEGIN with the key's claim, the INSERT, COMMIT with the stored key), and a replay takes two (the claim with the read, then ROLLBACK). When the clients, the server and Postgres share a few cores, throughput is set by CPU per request, not by round trips: a key adds five statements to the endpoint's one (the advisory lock, the read of the key, the stored row with its index entries, and the commit check's open and close: a row of an unlogged table, which a foreign key checked at COMMIT keeps from being committed, inserted and then deleted: what makes certain that only the server commits), and that work, on both the Go and the Postgres side, is what separates the two throughputs. A replay opens no commit check (its transaction only reads, and rolls back), and cannot be cheaper than HTTP plus one read of the key, its lock, and the end of its transaction, which the rules require (the read after the lock, in its own statement; the answer after the transaction ended). With Postgres on a host of its own, its CPU per request would set the limit instead, and the five statements weigh there too. The targets (0.8× and 3×) are not met on this machine for these reasons; meeting them would take dropping the key's row, reading the key before its lock, or trusting a handler never to commit on a connection reached around its guard, and docs/http.md says why each is refused.

`

// writeMarkdown writes the results into BENCHMARKS.md's section of this
// program, keeping the rest of the file.
func (r *results) writeMarkdown(path, postgres string) error {
	var sb strings.Builder
	fmt.Fprintf(&sb, "## HTTP front door (package idempotency)\n\nGenerated by `kafkaonce-httpbench` on %s (%d cores, Postgres from %s). Do not edit by hand: run\n\n    go run ./cmd/kafkaonce-httpbench -markdown BENCHMARKS.md\n\n",
		r.when.Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), postgres)
	fmt.Fprintf(&sb, "One endpoint that inserts a row and answers 201, on loopback, served two ways side by side: plain (its own transaction, no key) and behind `idempotency.Server` (each request a new key: claimed, the row and the stored response in one transaction). Replays send keys already completed. %d rounds of %.0f s per cell, the modes interleaved; throughput is the median of the rounds, latencies are pooled. The clients run on the same machine as the server and Postgres.\n\n", r.rounds, r.seconds)
	for _, table := range [][][]string{r.targets(), r.rows()} {
		for i, row := range table {
			sb.WriteString("| " + strings.Join(row, " | ") + " |\n")
			if i == 0 {
				sb.WriteString("|" + strings.Repeat("---|", len(row)) + "\n")
			}
		}
		sb.WriteString("\n")
	}
	sb.WriteString(whereTheTimeGoes)
	return benchdoc.Write(path, section, sb.String())
}
