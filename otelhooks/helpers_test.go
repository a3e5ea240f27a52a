package otelhooks_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/otelhooks"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// tracing is a tracer provider that keeps every span, sampled, in memory,
// exported as it ends.
type tracing struct {
	tp  *sdktrace.TracerProvider
	exp *tracetest.InMemoryExporter
}

func newTracing(t *testing.T) *tracing {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracing{tp: tp, exp: exp}
}

// newSetup is what a test of the hooks runs on: a schema with an effects
// table, a topic of one partition, and a tracer provider that keeps every
// span.
func newSetup(t *testing.T) (db *testenv.DB, k *testenv.Kafka, topic string, tr *tracing) {
	t.Helper()
	db = testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	k = testenv.NewKafka(t)
	return db, k, k.Topic(t, 1), newTracing(t)
}

func (tr *tracing) spans() tracetest.SpanStubs { return tr.exp.GetSpans() }

// named returns the ended spans called name.
func (tr *tracing) named(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.spans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// handlerSpanOf returns the span of the handler call for message id.
func (tr *tracing) handlerSpanOf(t *testing.T, topic, id string) tracetest.SpanStub {
	t.Helper()
	for _, s := range tr.named("process " + topic) {
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" && a.Value.AsString() == id {
				return s
			}
		}
	}
	require.Failf(t, "no handler span", "for message %q among %v", id, tr.names())
	return tracetest.SpanStub{}
}

func (tr *tracing) names() []string {
	var out []string
	for _, s := range tr.spans() {
		out = append(out, s.Name)
	}
	return out
}

// tree renders the spans of one trace as an indented tree with durations,
// each span's links after it: what the README shows, with the test's topic
// called "orders".
func tree(spans tracetest.SpanStubs, traceID trace.TraceID, topic string) string {
	name := func(s tracetest.SpanStub) string { return strings.ReplaceAll(s.Name, topic, "orders") }
	byParent := map[trace.SpanID][]tracetest.SpanStub{}
	names := map[trace.SpanID]string{}
	for _, s := range spans {
		names[s.SpanContext.SpanID()] = s.Name
	}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanContext.TraceID() != traceID {
			continue
		}
		if _, ok := names[s.Parent.SpanID()]; ok && s.Parent.TraceID() == traceID {
			byParent[s.Parent.SpanID()] = append(byParent[s.Parent.SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	var b strings.Builder
	var walk func(s tracetest.SpanStub, depth int)
	walk = func(s tracetest.SpanStub, depth int) {
		fmt.Fprintf(&b, "%s%-*s %8s  %s\n", strings.Repeat("  ", depth), 24-2*depth, name(s),
			s.EndTime.Sub(s.StartTime).Round(10*time.Microsecond), s.SpanKind)
		for _, l := range s.Links {
			fmt.Fprintf(&b, "%s  ↳ link: %s\n", strings.Repeat("  ", depth), strings.ReplaceAll(describe(spans, l.SpanContext), topic, "orders"))
		}
		kids := byParent[s.SpanContext.SpanID()]
		slices.SortFunc(kids, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	slices.SortFunc(roots, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	for _, r := range roots {
		walk(r, 0)
	}
	return b.String()
}

func describe(spans tracetest.SpanStubs, sc trace.SpanContext) string {
	for _, s := range spans {
		if s.SpanContext.SpanID() == sc.SpanID() {
			return fmt.Sprintf("%q (trace %s…)", s.Name, sc.TraceID().String()[:8])
		}
	}
	return sc.SpanID().String()
}

// run runs a consumer of topic with hooks until stop returns true.
func run(t *testing.T, db *testenv.DB, k *testenv.Kafka, topic string, h *otelhooks.Hooks, handle consumer.HandlerFunc, stop func() bool) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(db.Pool, &consumer.Config{
		Name: "ledger", GroupID: testenv.Name(t, "g"), Brokers: k.Brokers, Topics: []string{topic}, Schema: db.Schema,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, Retry: consumer.RetryPolicy{InitialInterval: time.Millisecond},
		Logger:  quiet,
		Handler: handle,
		Hooks:   []consumer.Hook{h},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for !stop() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for the run")
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)
	return c
}

// applied returns a handler that records each message id in the effects
// table, with a span of its own under the handler's.
func applied(db *testenv.DB, tr *tracing) consumer.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		ctx, span := tr.tp.Tracer("app").Start(ctx, "apply")
		defer span.End()
		_, err := tx.Exec(ctx, `INSERT INTO `+db.Table("effects")+` VALUES ($1)`, m.ID)
		return err
	}
}

func effects(t *testing.T, db *testenv.DB) int64 {
	return db.Int(t, `SELECT count(*) FROM `+db.Table("effects"))
}
