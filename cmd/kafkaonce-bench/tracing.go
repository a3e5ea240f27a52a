package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/benchdoc"
	"github.com/kafkaonce/kafkaonce/otelhooks"
)

// tracingSection is the part of BENCHMARKS.md the tracing cells (-tracing)
// write; a run of the consumer cells keeps it.
const tracingSection = "kafkaonce-bench-tracing"

// The tracing cells (-tracing) measure what tracing costs: the base cell
// with every message carrying a traceparent of its own (as if each was
// written by a request of its own: a link per message on the batch's span,
// a parent to extract for each handler span), consumed by the per-message
// Handler and by the BatchHandler, each with tracing off and on, in the
// same run, interleaved. On: otelhooks with an SDK tracer provider that
// samples every span and exports them, through the SDK's batch span
// processor, to an exporter that drops them: the whole cost of making and
// handing over the spans, none of the network's.
var tracingPairs = [][2]string{{"kafkaonce", "kafkaonce-traced"}, {"kafkaonce-batch", "kafkaonce-batch-traced"}}

// spansExported counts the spans the discarding exporter was handed.
var spansExported atomic.Int64

type discardSpans struct{}

func (discardSpans) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	spansExported.Add(int64(len(spans)))
	return nil
}

func (discardSpans) Shutdown(context.Context) error { return nil }

// traced runs a mode's consumer with otelhooks and a tracer provider of
// its own, flushed when the run ends.
func traced(run func(context.Context, *env, cell, backlog, *recorder) error) func(context.Context, *env, cell, backlog, *recorder) error {
	return func(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(discardSpans{},
			// A queue deep enough that no span is dropped: the cost of all.
			sdktrace.WithMaxQueueSize(1<<16), sdktrace.WithMaxExportBatchSize(4096)))
		defer tp.Shutdown(context.Background())
		h, err := otelhooks.New("bench", otelhooks.WithTracerProvider(tp))
		if err != nil {
			return err
		}
		return run(withHooks(ctx, "-traced", h), e, c, b, rec)
	}
}

// wrappedKey carries what a wrapped mode changes in runConsumer's config
// and in the hand-written loops: hooks to add, a suffix for the group (a
// group of its own, or it would find the unwrapped mode's offsets
// committed at the log end), and the Kafka client ("": franz-go).
type wrappedKey struct{}

type wrapped struct {
	hooks  []consumer.Hook
	group  string
	client string
}

func withHooks(ctx context.Context, group string, hs ...consumer.Hook) context.Context {
	return context.WithValue(ctx, wrappedKey{}, wrapped{hooks: hs, group: group})
}

// onKafkaGo runs a mode with the kafka-go client.
func onKafkaGo(run func(context.Context, *env, cell, backlog, *recorder) error) func(context.Context, *env, cell, backlog, *recorder) error {
	return func(ctx context.Context, e *env, c cell, b backlog, rec *recorder) error {
		return run(context.WithValue(ctx, wrappedKey{}, wrapped{group: "-kafka-go", client: kafkaGo}), e, c, b, rec)
	}
}

func wrapping(ctx context.Context) wrapped {
	w, _ := ctx.Value(wrappedKey{}).(wrapped)
	return w
}

// newTraceparent returns a W3C traceparent of a new, sampled trace.
func newTraceparent() []byte {
	var ids [24]byte
	_, _ = rand.Read(ids[:])
	return []byte("00-" + hex.EncodeToString(ids[:16]) + "-" + hex.EncodeToString(ids[16:]) + "-01")
}

func runTracingCells(ctx context.Context, log *slog.Logger, o options) error {
	e, err := openEnv(ctx, log, o, 40)
	if err != nil {
		return err
	}
	defer e.close()
	c := base
	c.Traceparent = true
	var modes []string
	for _, p := range tracingPairs {
		modes = append(modes, p[0], p[1])
	}
	var results []result
	spans := map[string]int64{}
	for round := 1; round <= o.rounds; round++ {
		topic := fmt.Sprintf("bench-tracing-r%d-%d", round, time.Now().UnixNano())
		if err := createTopic(ctx, e, topic, c.Partitions); err != nil {
			return err
		}
		b, err := produce(ctx, e.brokers, topic, c, o.messages, uint64(round))
		if err != nil {
			return err
		}
		order := slices.Clone(modes)
		for range round - 1 { // rotate: no mode always runs first
			order = append(order[1:], order[0])
		}
		for _, name := range order {
			before := spansExported.Load()
			r, err := runOne(ctx, e, modeNamed(name), c, b, round, o)
			if err != nil {
				return fmt.Errorf("%s on %s: %w", name, c, err)
			}
			spans[name] += spansExported.Load() - before
			log.Info("tracing run", "round", round, "mode", name, "msgs/s", int(r.MsgsPerSec), "check", r.Correct)
			results = append(results, r)
		}
		if err := deleteTopic(ctx, e, topic); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	md, ratios := tracingMarkdown(results, spans, c, o, (&report{env: e}).machine())
	fmt.Print(md)
	fmt.Println(ratios)
	if o.markdown == "" {
		return nil
	}
	return benchdoc.Write(o.markdown, tracingSection, md)
}

// tracingMarkdown writes the tracing section: each pair's median
// throughput off and on, and their ratio; ratios is the last line of
// stdout.
func tracingMarkdown(results []result, spans map[string]int64, c cell, o options, machine string) (md, ratios string) {
	median := func(mode string) (float64, float64) {
		var v []float64
		var msgs int64
		for _, r := range results {
			if r.Mode == mode {
				v = append(v, r.MsgsPerSec)
				msgs += r.Messages
			}
		}
		perMsg := 0.0
		if msgs > 0 {
			perMsg = float64(spans[mode]) / float64(msgs)
		}
		return medianOf(v), perMsg
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "## Tracing\n\nGenerated by `kafkaonce-bench -tracing` on %s:\n\n    go run ./cmd/kafkaonce-bench -tracing -rounds %d -messages %d -markdown BENCHMARKS.md\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), o.rounds, o.messages)
	fmt.Fprintf(&sb, "**Machine:** %s. Cell: %s, every message with a traceparent of its own. ", machine, c)
	sb.WriteString("Off: no tracing hooks. On: `otelhooks` with an SDK tracer provider sampling 100% of spans, exported by the batch span processor to an exporter that drops them. Modes interleaved, median of the rounds.\n\n")
	sb.WriteString("| handler | off (msgs/s) | on (msgs/s) | on / off | spans per message |\n|---|---|---|---|---|\n")
	var parts []string
	for _, p := range tracingPairs {
		off, _ := median(p[0])
		on, perMsg := median(p[1])
		ratio := 0.0
		if off > 0 {
			ratio = on / off
		}
		fmt.Fprintf(&sb, "| %s | %.0f | %.0f | %.2f | %.3f |\n", p[0], off, on, ratio, perMsg)
		parts = append(parts, fmt.Sprintf("%q: %.3f", p[0]+" traced/untraced", ratio))
	}
	sb.WriteString("\nTarget: on ≥ 0.9 × off.\n")
	return sb.String(), "{" + strings.Join(parts, ", ") + "}"
}
