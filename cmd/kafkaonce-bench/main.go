// Command kafkaonce-bench measures kafkaonce against the loops people write
// by hand, side by side in one process and one run:
//
//	go run ./cmd/kafkaonce-bench -quick     # under 2 minutes
//	go run ./cmd/kafkaonce-bench            # the full set (see BENCHMARKS.md)
//
// Modes: raw (franz-go fetching, no database: the Kafka-side ceiling;
// raw-kafka-go with kafka-go),
// naive-1 and naive-pp (per message: begin, insert-on-conflict into a
// dedupe table, the effect, commit, synchronous offset commit; one worker,
// or one per partition), optimum (a hand-written batched loop: one round
// trip per batch that claims and applies, asynchronous offset commits) and
// kafkaonce (a consumer.Handler, one call per message) and kafkaonce-batch
// (a consumer.BatchHandler queueing the optimum's set-based statement), all
// with the same effect; for the slow (2 ms) effect also kafkaonce-keys, a
// BatchHandler running the waits of up to 32 keys at a time with
// consumer.ForEachKey.
//
// Hot rows (full set; naive-pp, optimum, kafkaonce, kafkaonce-batch): the
// transfer effect moves 1 unit between two of a few hot accounts
// (accounts=50, and 5), each mode locking the accounts in id order (see
// transfer.go). The per-message loop stops at -slow-budget, the others at
// -hot-budget; -only transfer runs these cells alone. Every run records
// its longest stall: the longest time a partition went without a commit
// while it had messages left (see stalls).
//
// Each round produces a fresh topic per cell and runs every mode on it, in
// an order that rotates between rounds; tables report the median of the
// rounds. Every run claims under a consumer name of its own, short and of
// the same length for every mode (the hand-written loops store it in every
// claimed row and index). Database round trips and offset commits are counted on the wire,
// allocations with runtime.MemStats, peak RSS from /proc (the broker runs
// in a child process so that none of this is the broker's). Round trips,
// allocations and bytes are also counted over each run's second half
// alone, from the moment half of its messages are done: the steady state,
// after connections, prepared statements and per-partition buffers exist.
//
// Latency (full set; optimum, kafkaonce, kafkaonce-batch): each message is
// timed from its producer's clock to its commit while a producer sends at
// half the mode's maximum for 15 seconds. Two maxima: the capacity, the
// highest rate the mode keeps up with while the producer runs on the same
// machine (a ramp: 40% to 130% of the drain rate in steps of 10%, 4 seconds
// each, kept up with while less than 250 ms of messages wait), and the
// drain rate (msgs/s from a backlog produced beforehand), which leaves the
// producer and the broker out and so makes half of it a heavier load.
//
// Outbox (-outbox, run alone): one relay delivering to a simulated API for
// healthy keys, with and without a hot key whose receiver answers 429; see
// outbox.go.
//
// Tracing (-tracing, run alone): the base cell with tracing off and on
// (otelhooks, every span sampled), side by side; see tracing.go.
//
// Clients (-clients, run alone): the base cells with each Kafka client,
// franz-go and kafka-go, side by side; see clients.go.
//
// Rolling restart (-rolling, run alone, against a real broker): how long
// partitions go without a commit while the members of a group restart one
// at a time, with eager, cooperative and static groups on the classic
// protocol, and dynamic and static ones on the consumer protocol (KIP-848,
// where the broker serves it); see rolling.go.
//
// Share groups (-share, run alone): a handler waiting 20 ms on a partner
// per message, on one partition: kafkaonce's consumer group against its
// share mode with 1, 4, 8 and 16 members; then the base cells with one
// share member against the consumer group; see share.go.
//
// Output: a table on stdout, results as JSON (-json), an SVG chart and
// BENCHMARKS.md (-markdown); the last line of stdout is a JSON object with
// the key ratios.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

// mode is one way of consuming a backlog.
type mode struct {
	name string
	run  func(context.Context, *env, cell, backlog, *recorder) error
	// usesDB means the run leaves claims and effects to check.
	usesDB bool
	// slow modes get a time budget instead of the whole backlog.
	slow bool
}

var allModes = []mode{
	{"raw", runRaw, false, false},
	{"raw-kafka-go", onKafkaGo(runRaw), false, false},
	{"naive-1", runNaiveOne, true, true},
	{"naive-pp", runNaivePerPartition, true, true},
	{"optimum", runOptimum, true, false},
	{"kafkaonce", runKafkaonce, true, false},
	{"kafkaonce-batch", runKafkaonceBatch, true, false},
	{"kafkaonce-keys", runKafkaonceKeys, true, false},
	{"kafkaonce-traced", traced(runKafkaonce), true, false},
	{"kafkaonce-batch-traced", traced(runKafkaonceBatch), true, false},
	{"kafkaonce-kafka-go", onKafkaGo(runKafkaonce), true, false},
	{"kafkaonce-batch-kafka-go", onKafkaGo(runKafkaonceBatch), true, false},
	{"kafkaonce-cg", grouping, true, false},
	{"kafkaonce-share-1", sharing(1), true, false},
	{"kafkaonce-share-4", sharing(4), true, false},
	{"kafkaonce-share-8", sharing(8), true, false},
	{"kafkaonce-share-16", sharing(16), true, false},
}

type options struct {
	quick          bool
	rounds         int
	messages       int
	slowBudget     time.Duration
	hotBudget      time.Duration
	prefill        int
	jsonPath       string
	markdown       string
	chartPath      string
	only           string
	modes          string
	cpuProfile     string
	memProfile     string
	from           string
	latency        bool
	loadShare      float64
	memory         bool
	verbose        bool
	outbox         bool
	outboxDuration time.Duration
	tracing        bool
	clients        bool
	rolling        bool
	share          bool
	shareBase      bool
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == serveBrokerArg {
		serveBroker()
		return
	}
	var o options
	fs := flag.NewFlagSet("kafkaonce-bench", flag.ExitOnError)
	fs.BoolVar(&o.quick, "quick", false, "the quick set: two cells, two rounds, under 2 minutes")
	fs.IntVar(&o.rounds, "rounds", 0, "rounds of interleaved runs (default 2 quick, 3 full)")
	fs.IntVar(&o.messages, "messages", 0, "backlog per cell and round (default 120,000 quick, 200,000 full)")
	fs.DurationVar(&o.slowBudget, "slow-budget", 0, "how long the per-message loops run per cell (default 5s quick, 10s full)")
	fs.DurationVar(&o.hotBudget, "hot-budget", 60*time.Second, "how long the other modes run per hot-rows cell at most (the per-message loops keep -slow-budget)")
	fs.IntVar(&o.prefill, "prefill", 10_000_000, "rows in the pre-filled processed_messages table (full set)")
	fs.StringVar(&o.jsonPath, "json", "bench-results/results.json", "where to write every run as JSON (empty: nowhere)")
	fs.StringVar(&o.markdown, "markdown", "", "write BENCHMARKS.md here (full set; empty: not written)")
	fs.StringVar(&o.chartPath, "chart", "", "write the throughput chart (SVG) here (default next to -markdown)")
	fs.StringVar(&o.only, "only", "", "run only the cells whose description contains this (ending it with $: ends with it)")
	fs.StringVar(&o.modes, "modes", "", "run only these modes, comma-separated (e.g. optimum,kafkaonce-batch)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run here")
	fs.StringVar(&o.memProfile, "memprofile", "", "write an allocation profile of the whole run here")
	fs.StringVar(&o.from, "from", "", "rebuild the table, chart and BENCHMARKS.md from a saved -json file instead of running")
	fs.BoolVar(&o.latency, "latency", true, "measure end-to-end latency at half of each mode's capacity and drain rate (full set)")
	fs.Float64Var(&o.loadShare, "latency-load", 0.5, "the share of each mode's capacity (and drain rate) the latency runs produce at")
	fs.BoolVar(&o.memory, "memory", true, "measure peak RSS draining 1M and 10M message backlogs (full set)")
	fs.BoolVar(&o.verbose, "v", false, "log the consumers' own messages")
	fs.BoolVar(&o.outbox, "outbox", false, "run only the outbox relay cells (a hot failing key beside healthy ones, and without it); -markdown then rewrites only their section")
	fs.BoolVar(&o.tracing, "tracing", false, "run only the tracing cells (the base cell with tracing off and on, per-message and batch handlers); -markdown then rewrites only their section")
	fs.BoolVar(&o.rolling, "rolling", false, "run only the rolling restart (3 members, 12 partitions, each restarted in turn; eager, cooperative and static groups on the classic protocol, dynamic and static on the consumer protocol where the broker serves it) against KAFKA_BROKERS; -markdown then rewrites only its section")
	fs.BoolVar(&o.clients, "clients", false, "run only the client cells (each mode with franz-go and with kafka-go, side by side); -markdown then rewrites only their section")
	fs.BoolVar(&o.share, "share", false, "run only the share cells (a 20 ms partner wait per message on 1 partition: the consumer group against share groups of 1, 4, 8 and 16 members; then the base cells, update and no-op, against a share group of 1); -messages is the partner backlog (default 1,000); -markdown then rewrites only their section (kfake's, or the real broker's with KAFKA_BROKERS)")
	fs.BoolVar(&o.shareBase, "share-base", true, "with -share, also run the base cells (update and no-op, 12 partitions, 100,000 messages) with one share member against the consumer group")
	fs.DurationVar(&o.outboxDuration, "outbox-duration", 10*time.Second, "how long the outbox cells write at a steady rate")
	apply := devenv.RegisterFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: kafkaonce-bench [flags]\n\nMeasures kafkaonce against hand-written consumer loops; see BENCHMARKS.md.\n\n")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	apply()
	o.defaults()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	run := run
	if o.from != "" {
		run = rebuild
	}
	if o.outbox {
		run = runOutboxCells
	}
	if o.tracing {
		run = runTracingCells
	}
	if o.clients {
		run = runClientCells
	}
	if o.rolling {
		run = runRollingRestart
	}
	if o.share {
		run = runShareCells
	}
	if err := run(ctx, log, o); err != nil {
		fmt.Fprintln(os.Stderr, "kafkaonce-bench:", err)
		os.Exit(1)
	}
}

func (o *options) defaults() {
	pick := func(v *int, quick, full int) {
		if *v == 0 {
			*v = full
			if o.quick {
				*v = quick
			}
		}
	}
	pick(&o.rounds, 2, 3)
	if o.share {
		// The partner backlog: 20 s of the consumer group at 20 ms a
		// message.
		pick(&o.messages, 1000, 1000)
	}
	pick(&o.messages, 120_000, 200_000)
	if o.slowBudget == 0 {
		o.slowBudget = 10 * time.Second
		if o.quick {
			o.slowBudget = 4 * time.Second
		}
	}
	if o.markdown != "" && o.chartPath == "" {
		o.chartPath = strings.TrimSuffix(o.markdown, "BENCHMARKS.md") + "docs/benchmark-throughput.svg"
	}
}

// base is the cell the full set varies one axis at a time from.
var base = cell{Partitions: 12, IDs: idUUIDv7, Effect: effectUpdate, Size: 100, MaxBatch: 1000}

// plan lists the cells to run and which modes run on each.
type planned struct {
	c     cell
	modes []string
	msgs  int // backlog (0: the default)
	group string
}

func buildPlan(o options) []planned {
	all := []string{"raw", "naive-1", "naive-pp", "optimum", "kafkaonce", "kafkaonce-batch"}
	fast := []string{"raw", "optimum", "kafkaonce", "kafkaonce-batch"}
	with := func(f func(*cell)) cell { c := base; f(&c); return c }
	if o.quick {
		return []planned{
			{c: base, modes: all, group: "quick"},
			{c: with(func(c *cell) { c.Effect = effectNoop }), modes: fast, group: "quick"},
		}
	}
	p := []planned{
		{c: base, modes: all, group: "axes"},
		{c: with(func(c *cell) { c.Partitions = 1 }), modes: all, msgs: 50_000, group: "axes"},
		{c: with(func(c *cell) { c.Prefilled = true }), modes: fast, group: "axes"},
		{c: with(func(c *cell) { c.IDs = idUUIDv4 }), modes: fast, group: "axes"},
		{c: with(func(c *cell) { c.IDs = idPosition }), modes: fast, group: "axes"},
		{c: with(func(c *cell) { c.Dups = 0.10 }), modes: fast, group: "axes"},
		{c: with(func(c *cell) { c.Effect = effectNoop }), modes: all, group: "axes"},
		{c: with(func(c *cell) { c.Effect = effectWait }), modes: append(fast, "kafkaonce-keys"), msgs: 20_000, group: "axes"},
		// Per-key concurrency against one partition's sequential rate.
		{c: with(func(c *cell) { c.Effect, c.Partitions = effectWait, 1 }), modes: []string{"optimum", "kafkaonce", "kafkaonce-batch", "kafkaonce-keys"}, msgs: 5_000, group: "axes"},
		{c: with(func(c *cell) { c.Size = 1024 }), modes: fast, group: "axes"},
	}
	for _, b := range []int{1, 10, 100} {
		p = append(p, planned{c: with(func(c *cell) { c.MaxBatch = b }), modes: []string{"optimum", "kafkaonce", "kafkaonce-batch"}, msgs: min(5000*b, 200_000), group: "batch size"})
	}
	return append(p, hotPlan(with)...)
}

// hotMessages is the backlog of a hot-rows cell: enough for the batched
// modes to run for a second or more, more than the per-message loop gets
// through in its time budget (about 7,000 msgs/s at best, 50 accounts).
const hotMessages = 200_000

// hotPlan lists the hot-rows cells: transfers between 50 accounts, and
// between 5 (the extreme), on the base cell's 12 partitions and batches
// of 1000. No raw run: its figure would be the axes' own.
func hotPlan(with func(func(*cell)) cell) []planned {
	modes := []string{"naive-pp", "optimum", "kafkaonce", "kafkaonce-batch"}
	var p []planned
	for _, n := range []int{50, 5} {
		p = append(p, planned{c: with(func(c *cell) { c.Effect, c.Accounts = effectTransfer, n }), modes: modes, msgs: hotMessages, group: "hot rows"})
	}
	return p
}

func run(ctx context.Context, log *slog.Logger, o options) error {
	plan := buildPlan(o)
	if o.only != "" {
		want, exact := strings.CutSuffix(o.only, "$")
		plan = slices.DeleteFunc(plan, func(p planned) bool {
			if exact {
				return !strings.HasSuffix(p.c.String(), want)
			}
			return !strings.Contains(p.c.String(), want)
		})
	}
	if o.modes != "" {
		keep := strings.Split(o.modes, ",")
		for i := range plan {
			plan[i].modes = slices.DeleteFunc(slices.Clone(plan[i].modes), func(m string) bool { return !slices.Contains(keep, m) })
		}
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	needPrefill := slices.ContainsFunc(plan, func(p planned) bool { return p.c.Prefilled })
	e, err := openEnv(ctx, log, o, 40)
	if err != nil {
		return err
	}
	defer e.close()
	log.Info("environment", "kafka", e.brokerDesc, "postgres", e.pgDesc, "cpus", runtime.NumCPU())
	if needPrefill {
		if err := prefill(ctx, e.db, o.prefill, log); err != nil {
			return err
		}
	}

	var results []result
	for round := 1; round <= o.rounds; round++ {
		for ci, p := range plan {
			msgs := o.messages
			if p.msgs > 0 {
				msgs = p.msgs
			}
			topic := fmt.Sprintf("bench-r%d-c%d-%d", round, ci, time.Now().UnixNano())
			if err := createTopic(ctx, e, topic, p.c.Partitions); err != nil {
				return err
			}
			b, err := produce(ctx, e.brokers, topic, p.c, msgs, uint64(round*1000+ci))
			if err != nil {
				return err
			}
			// A new random order of modes every round (seeded, so a run can be
			// repeated): no mode always runs first, on a cold cache, or right
			// after the same neighbour, whose dead tuples autovacuum is
			// cleaning up meanwhile.
			order := slices.Clone(p.modes)
			rand.New(rand.NewPCG(uint64(round), uint64(ci))).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
			for _, name := range order {
				m := modeNamed(name)
				r, err := runOne(ctx, e, m, p.c, b, round, o)
				if err != nil {
					return fmt.Errorf("%s on %s: %w", name, p.c, err)
				}
				log.Info("run", "round", round, "cell", p.c.String(), "mode", name, "msgs/s", int(r.MsgsPerSec), "2nd half msgs/s", int(r.SteadyMsgsPerSec),
					"rt/batch", fmt.Sprintf("%.2f", r.RoundTripsPerBatch), "2nd half rt/batch", fmt.Sprintf("%.2f", r.SteadyRoundTripsPerBatch), "check", r.Correct)
				results = append(results, r)
			}
			if err := deleteTopic(ctx, e, topic); err != nil {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	if !o.quick && o.latency {
		lat, err := latencyRuns(ctx, e, results, o)
		if err != nil {
			return err
		}
		results = append(results, lat...)
	}
	if !o.quick && o.memory {
		mem, err := memoryRuns(ctx, e, o)
		if err != nil {
			return err
		}
		results = append(results, mem...)
	}
	if o.memProfile != "" {
		f, err := os.Create(o.memProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return err
		}
	}
	return output(newReport(results, e, o), o)
}

// rebuild makes the outputs of a saved run again (after a change to the
// report, say) without running anything.
func rebuild(_ context.Context, _ *slog.Logger, o options) error {
	b, err := os.ReadFile(o.from)
	if err != nil {
		return err
	}
	var saved struct {
		When    time.Time `json:"when"`
		Machine string    `json:"machine"`
		Runs    []result  `json:"runs"`
	}
	if err := json.Unmarshal(b, &saved); err != nil {
		return fmt.Errorf("%s: %w", o.from, err)
	}
	rep := newReport(saved.Runs, nil, o)
	rep.when, rep.machineDesc = saved.When, saved.Machine
	if o.jsonPath == o.from {
		o.jsonPath = "" // do not overwrite the input
	}
	return output(rep, o)
}

// output prints the table and writes what the options ask for; the last
// line of stdout is the summary.
func output(rep *report, o options) error {
	rep.printTable(os.Stdout)
	if o.jsonPath != "" {
		if err := rep.writeJSON(o.jsonPath); err != nil {
			return err
		}
	}
	if o.chartPath != "" {
		if err := rep.writeChart(o.chartPath); err != nil {
			return err
		}
	}
	if o.markdown != "" {
		if err := rep.writeMarkdown(o.markdown, o.chartPath); err != nil {
			return err
		}
	}
	line, _ := json.Marshal(rep.summary())
	fmt.Println(string(line))
	return nil
}

func modeNamed(name string) mode {
	for _, m := range allModes {
		if m.name == name {
			return m
		}
	}
	panic("unknown mode " + name)
}

// runOne runs one mode over a backlog and checks what it did.
func runOne(ctx context.Context, e *env, m mode, c cell, b backlog, round int, o options) (result, error) {
	r := result{Mode: m.name, Cell: c, Round: round}
	if err := settle(ctx, e.db); err != nil {
		return r, err
	}
	before, err := accountTotals(ctx, e.db)
	if err != nil {
		return r, err
	}
	rec := newRecorder(b.total)
	rec.stalls = newStalls(b.perPartition)
	rctx, cancel := context.WithTimeout(ctx, budget(m, c, o))
	defer cancel()
	snap := takeSnapshot(e, rec)
	err = m.run(rctx, e, c, b, rec)
	rec.stop(stoppedAt(rctx))
	snap.finish(e, &r, rec)
	if err != nil {
		return r, err
	}
	r.Correct = "-"
	if m.usesDB {
		after, err := accountTotals(ctx, e.db)
		if err != nil {
			return r, err
		}
		r.Correct, err = check(c, b, rec, before, after)
		if err != nil {
			return r, fmt.Errorf("%s: %w", m.name, err)
		}
	}
	return r, nil
}

// budget is how long a run may take: the per-message loops get
// -slow-budget; the other modes get -hot-budget on hot rows, where a
// consumer whose transactions deadlock could take hours over its backlog,
// and 10 minutes elsewhere.
func budget(m mode, c cell, o options) time.Duration {
	switch {
	case m.slow:
		return o.slowBudget
	case c.hot():
		return o.hotBudget
	}
	return 10 * time.Minute
}

// stoppedAt is when a run under ctx stopped: now, or the end of its time
// budget if that came first (a consumer may take a moment to stop).
func stoppedAt(ctx context.Context) time.Time {
	now := time.Now()
	if d, ok := ctx.Deadline(); ok && d.Before(now) {
		return d
	}
	return now
}

// check verifies a finished run applied each distinct message's effect
// once: the UPDATE (alone, or after the partner's wait) adds one per
// message to the balance sum; a transfer
// leaves the balance sum as it was and adds one posting to each of its
// two accounts. A run stopped by its time budget can only be checked for
// transfers left half-applied.
func check(c cell, b backlog, rec *recorder, before, after totals) (string, error) {
	if c.Effect == effectTransfer && after.balance != before.balance {
		return "", fmt.Errorf("the transfers changed the balance sum by %d", after.balance-before.balance)
	}
	if rec.done.Load() < int64(b.total) {
		return "partial (time budget)", nil
	}
	switch c.Effect {
	case effectUpdate, effectPartner:
		if delta := after.balance - before.balance; delta != int64(b.unique) {
			return "", fmt.Errorf("the effect was applied %d times for %d distinct messages", delta, b.unique)
		}
	case effectTransfer:
		if delta := after.postings - before.postings; delta != 2*int64(b.unique) {
			return "", fmt.Errorf("the transfers made %d postings for %d distinct messages (2 each)", delta, b.unique)
		}
	default:
		return "complete", nil
	}
	return "once each", nil
}
