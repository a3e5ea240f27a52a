package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/benchdoc"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// outboxSection is the part of BENCHMARKS.md the outbox cells (-outbox)
// write; a run of the consumer cells keeps it.
const outboxSection = "kafkaonce-bench-outbox"

// The outbox cells (-outbox) measure one relay delivering to a simulated
// API (each call takes outboxCallLatency) for 64 healthy keys, with and
// without a hot key whose every call is answered 429 with Retry-After 1s,
// outboxHotBacklog of its rows queued ahead of everything (more than a
// round's BatchSize) and a tenth of the rows written meanwhile. Each run:
//
//   - drain: the healthy keys' rows/s emptying a backlog of -messages/10
//     rows written beforehand;
//   - steady: then, rows written at outboxRate in transactions of 20, the
//     healthy rows' delay from the write to the delivery (p50, p99), for
//     -outbox-duration;
//   - rounds: the relay's transactions per second over the whole run.
const (
	outboxCallLatency = time.Millisecond
	outboxHotBacklog  = 1000
	outboxRate        = 1000
	outboxPerTx       = 20
	outboxSchema      = "kafkaonce_bench_outbox"
)

type outboxRun struct {
	hot          bool
	drainPerSec  float64
	p50, p99     time.Duration
	roundsPerSec float64
	hotWritten   int
}

// countingDB counts the relay's transactions.
type countingDB struct {
	*pgxpool.Pool
	begins atomic.Int64
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	c.begins.Add(1)
	return c.Pool.Begin(ctx)
}

func runOutboxCells(ctx context.Context, log *slog.Logger, o options) error {
	e, err := startEnv(ctx, log, os.Getenv("KAFKA_BROKERS"), os.Getenv("DATABASE_URL"), 8)
	if err != nil {
		return err
	}
	defer e.close()
	var runs []outboxRun
	for round := 1; round <= o.rounds; round++ {
		for _, hot := range []bool{round%2 == 0, round%2 == 1} { // alternate which goes first
			r, err := outboxCell(ctx, e.db, hot, o.messages/10, o.outboxDuration)
			if err != nil {
				return err
			}
			log.Info("outbox run", "round", round, "hot failing key", hot, "drain rows/s", int(r.drainPerSec), "p50", r.p50, "p99", r.p99,
				"rounds/s", int(r.roundsPerSec))
			runs = append(runs, r)
		}
	}
	md := outboxMarkdown(runs, o, (&report{env: e}).machine())
	fmt.Print(md)
	if o.markdown == "" {
		return nil
	}
	return benchdoc.Write(o.markdown, outboxSection, md)
}

func outboxCell(ctx context.Context, pool *pgxpool.Pool, hot bool, backlog int, steadyFor time.Duration) (outboxRun, error) {
	run := outboxRun{hot: hot}
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+outboxSchema+` CASCADE`); err != nil {
		return run, err
	}
	if _, err := consumer.Migrate(ctx, pool, outboxSchema); err != nil {
		return run, err
	}
	ob, err := outbox.New(outboxSchema)
	if err != nil {
		return run, err
	}
	healthy := 0
	write := func(n int, hotEvery int) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var msgs []outbox.Message
			for j := range n {
				if hot && hotEvery > 0 && j%hotEvery == 0 {
					msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("hot-%d", run.hotWritten), Destination: "api", Key: []byte("hot"), Value: make([]byte, 100)})
					run.hotWritten++
					continue
				}
				msgs = append(msgs, outbox.Message{Destination: "api", Key: []byte("k" + strconv.Itoa(healthy%64)), Value: make([]byte, 100)})
				healthy++
			}
			_, err := ob.Write(ctx, tx, msgs...)
			return err
		})
	}
	if hot {
		for run.hotWritten < outboxHotBacklog {
			if err := write(outboxPerTx, 1); err != nil {
				return run, err
			}
		}
	}
	for healthy < backlog {
		if err := write(min(500, backlog-healthy), 0); err != nil {
			return run, err
		}
	}

	var mu sync.Mutex
	var delivered int
	var delays []time.Duration
	var lastDelivery time.Time
	recording := false
	deliver := func(ctx context.Context, d *outbox.Delivery) error {
		if string(d.Key) == "hot" {
			return outbox.RetryAfter(errors.New("HTTP 429 Too Many Requests"), time.Second)
		}
		time.Sleep(outboxCallLatency)
		return nil
	}
	db := &countingDB{Pool: pool}
	r, err := outbox.NewRelay(db, &outbox.RelayConfig{Schema: outboxSchema, Deliver: deliver, MaxAttempts: 1 << 20,
		Logger: slog.New(slog.DiscardHandler),
		OnDelivered: func(id string, created time.Time) {
			if strings.HasPrefix(id, "hot-") {
				return
			}
			now := time.Now()
			mu.Lock()
			delivered++
			lastDelivery = now
			if recording {
				delays = append(delays, now.Sub(created))
			}
			mu.Unlock()
		}})
	if err != nil {
		return run, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	began := time.Now()
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	waitDelivered := func(n int, limit time.Duration) error {
		deadline := time.Now().Add(limit)
		for {
			mu.Lock()
			got := delivered
			mu.Unlock()
			if got >= n {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("outbox cell (hot failing key: %v): %d of %d healthy rows delivered after %v", hot, got, n, limit)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := waitDelivered(backlog, 5*time.Minute); err != nil {
		return run, err
	}
	mu.Lock()
	run.drainPerSec = float64(backlog) / lastDelivery.Sub(began).Seconds()
	recording = true
	mu.Unlock()

	tick := time.NewTicker(time.Second * outboxPerTx / outboxRate)
	for end := time.Now().Add(steadyFor); time.Now().Before(end); {
		<-tick.C
		if err := write(outboxPerTx, 10); err != nil {
			tick.Stop()
			return run, err
		}
	}
	tick.Stop()
	if err := waitDelivered(healthy, time.Minute); err != nil {
		return run, err
	}
	run.roundsPerSec = float64(db.begins.Load()) / time.Since(began).Seconds()
	mu.Lock()
	slices.Sort(delays)
	run.p50, run.p99 = delays[len(delays)/2], delays[int(0.99*float64(len(delays)-1))]
	mu.Unlock()
	return run, nil
}

func outboxMarkdown(runs []outboxRun, o options, machine string) string {
	med := func(hot bool, f func(outboxRun) float64) float64 {
		var v []float64
		for _, r := range runs {
			if r.hot == hot {
				v = append(v, f(r))
			}
		}
		return medianOf(v)
	}
	drain := func(r outboxRun) float64 { return r.drainPerSec }
	p50 := func(r outboxRun) float64 { return float64(r.p50.Microseconds()) / 1000 }
	p99 := func(r outboxRun) float64 { return float64(r.p99.Microseconds()) / 1000 }
	rounds := func(r outboxRun) float64 { return r.roundsPerSec }
	var sb strings.Builder
	fmt.Fprintf(&sb, "## Outbox relay: a hot failing key beside healthy ones\n\n")
	fmt.Fprintf(&sb, "Generated by `go run ./cmd/kafkaonce-bench -outbox -rounds %d -messages %d -outbox-duration %v -markdown BENCHMARKS.md` on %s (%s). ",
		o.rounds, o.messages, o.outboxDuration, time.Now().UTC().Format("2006-01-02 15:04 UTC"), machine)
	fmt.Fprintf(&sb, "One relay, default RelayConfig, delivers to a simulated API (each call %v) for 64 healthy keys; "+
		"in the second run a hot key, whose every call is answered 429 with Retry-After 1s, has %d rows queued ahead of them (more than a round's BatchSize of %d) and a tenth of the rows written meanwhile. "+
		"Drain: the healthy keys' rows/s emptying a backlog of %d rows. Steady: rows written at %d/s in transactions of %d for %v; the healthy rows' delay from the write to the delivery. "+
		"Median of %d rounds, the two runs alternating.\n\n",
		outboxCallLatency, outboxHotBacklog, outbox.DefaultBatchSize, o.messages/10, outboxRate, outboxPerTx, o.outboxDuration, o.rounds)
	sb.WriteString("| figure (healthy keys) | without the failing key | with it | ratio |\n|---|---|---|---|\n")
	row := func(name string, f func(outboxRun) float64, unit string) {
		a, b := med(false, f), med(true, f)
		fmt.Fprintf(&sb, "| %s | %.1f %s | %.1f %s | %.2f |\n", name, a, unit, b, unit, b/a)
	}
	row("drain throughput", drain, "rows/s")
	row("steady p50 delay", p50, "ms")
	row("steady p99 delay", p99, "ms")
	row("relay transactions", rounds, "/s")
	return sb.String()
}
