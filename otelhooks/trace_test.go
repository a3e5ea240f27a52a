package otelhooks_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/otelhooks"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// One message followed from the HTTP request that wrote it to the handler
// that applied it: the request's span (otelhttp around the idempotency
// front door) is in the handler's context when it writes the outbox row,
// Write stores its traceparent with the row, the relay publishes it, and
// the consumer's handler span is its child: one trace.
func TestOneTraceFromTheHTTPRequestToTheHandler(t *testing.T) {
	t.Parallel()
	db, k, topic, tr := newSetup(t)

	// The front door: POST /orders writes the order's event to the outbox.
	ob, err := outbox.New(db.Schema)
	require.NoError(t, err)
	front, err := idempotency.New(db.Pool, &idempotency.Config{Schema: db.Schema})
	require.NoError(t, err)
	srv := httptest.NewServer(otelhttp.NewHandler(front.HandleFunc(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) error {
		if _, err := ob.Write(r.Context(), tx, outbox.Message{ID: "order-1", Destination: topic, Key: []byte("o1"), Value: []byte("placed")}); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}), "orders", otelhttp.WithTracerProvider(tr.tp),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method + " " + r.URL.Path })))
	defer srv.Close()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{}`))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "k-1")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode)

	// The relay publishes the row; the consumer applies it.
	relay, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Schema: db.Schema, Brokers: k.Brokers, Logger: quiet})
	require.NoError(t, err)
	defer relay.Close()
	n, err := relay.Round(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	h, err := otelhooks.New("ledger", otelhooks.WithTracerProvider(tr.tp))
	require.NoError(t, err)
	run(t, db, k, topic, h, applied(db, tr), func() bool { return effects(t, db) == 1 })

	spans := tr.spans()
	httpSpans := tr.named("POST /orders")
	require.Len(t, httpSpans, 1, "spans: %v", tr.names())
	request := httpSpans[0]
	require.Equal(t, trace.SpanKindServer, request.SpanKind)
	traceID := request.SpanContext.TraceID()

	handler := tr.handlerSpanOf(t, topic, "order-1")
	require.Equal(t, traceID, handler.SpanContext.TraceID(), "one trace")
	require.Equal(t, request.SpanContext.SpanID(), handler.Parent.SpanID(), "the handler's span is a child of the span that wrote the row")
	require.True(t, handler.Parent.IsRemote())
	require.Equal(t, trace.SpanKindConsumer, handler.SpanKind)

	apply := tr.named("apply")
	require.Len(t, apply, 1)
	require.Equal(t, handler.SpanContext.SpanID(), apply[0].Parent.SpanID(), "the handler's context carries its span")

	// The batch transaction: a root of its own, linked to the producer's
	// span; the handler's span links back to it.
	batches := tr.named("transaction " + topic)
	require.Len(t, batches, 1)
	batch := batches[0]
	require.False(t, batch.Parent.IsValid(), "a batch has many parents: a root")
	require.Len(t, batch.Links, 1)
	require.Equal(t, request.SpanContext.SpanID(), batch.Links[0].SpanContext.SpanID())
	require.Len(t, handler.Links, 1)
	require.Equal(t, batch.SpanContext.SpanID(), handler.Links[0].SpanContext.SpanID())
	require.EqualValues(t, 1, attr(batch, "kafkaonce.applied").AsInt64())
	require.True(t, handler.StartTime.After(batch.StartTime) && handler.EndTime.Before(batch.EndTime), "the handler ran inside the transaction")

	t.Logf("the trace:\n%s\nthe batch's:\n%s", tree(spans, traceID, topic), tree(spans, batch.SpanContext.TraceID(), topic))
}

// attr returns a span's attribute by key.
func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

// traced returns a message carrying the trace context of a new span of
// tr's, and the span's context.
func traced(t *testing.T, tr *tracing, id string) (kafka.Message, trace.SpanContext) {
	ctx, span := tr.tp.Tracer("producer").Start(context.Background(), "produce "+id)
	span.End()
	m := kafka.Message{Key: []byte(id), Value: []byte("v-" + id), Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}}
	carrier := map[string]string{}
	w3cInject(ctx, carrier)
	for k, v := range carrier {
		m.Headers = append(m.Headers, kafka.Header{Key: k, Value: []byte(v)})
	}
	return m, span.SpanContext()
}

func plain(id, value string, headers ...kafka.Header) kafka.Message {
	return kafka.Message{Key: []byte(id), Value: []byte(value), Headers: append([]kafka.Header{{Key: "message-id", Value: []byte(id)}}, headers...)}
}

func TestABatchOfTwoTracesLinksToBoth(t *testing.T) {
	t.Parallel()
	db, k, topic, tr := newSetup(t)
	a, aCtx := traced(t, tr, "a")
	b, bCtx := traced(t, tr, "b")
	a2 := a // the same trace twice: one link
	a2.Headers = append([]kafka.Header{{Key: "message-id", Value: []byte("a2")}}, a.Headers[1:]...)
	k.Produce(t, topic, a, a2, b)
	h, err := otelhooks.New("ledger", otelhooks.WithTracerProvider(tr.tp))
	require.NoError(t, err)
	run(t, db, k, topic, h, applied(db, tr), func() bool { return effects(t, db) == 3 })

	batches := tr.named("transaction " + topic)
	require.Len(t, batches, 1, "the three messages were one transaction")
	var linked []trace.SpanID
	for _, l := range batches[0].Links {
		linked = append(linked, l.SpanContext.SpanID())
	}
	require.ElementsMatch(t, []trace.SpanID{aCtx.SpanID(), bCtx.SpanID()}, linked, "a link per distinct producer span")
	require.EqualValues(t, 3, attr(batches[0], "messaging.batch.message_count").AsInt64())
	for id, p := range map[string]trace.SpanContext{"a": aCtx, "a2": aCtx, "b": bCtx} {
		s := tr.handlerSpanOf(t, topic, id)
		require.Equal(t, p.TraceID(), s.SpanContext.TraceID(), id)
		require.Equal(t, p.SpanID(), s.Parent.SpanID(), id)
	}
}

func TestDuplicatesConflictsAndDeadLettersAreEventsOfTheBatch(t *testing.T) {
	t.Parallel()
	db, k, topic, tr := newSetup(t)
	// a, a again (skipped), poison (set aside), a with other content (a
	// conflict, set aside), c.
	k.Produce(t, topic, plain("a", "1"), plain("a", "1"), plain("poison", "2"), plain("a", "other"), plain("c", "3"))
	h, err := otelhooks.New("ledger", otelhooks.WithTracerProvider(tr.tp))
	require.NoError(t, err)
	handle := applied(db, tr)
	run(t, db, k, topic, h, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "poison" {
			return consumer.Permanent(errPoison)
		}
		return handle(ctx, tx, m)
	}, func() bool {
		return effects(t, db) == 2 && db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")) == 2
	})

	events := map[string][]map[string]string{}
	for _, s := range tr.named("transaction " + topic) {
		for _, e := range s.Events {
			attrs := map[string]string{}
			for _, a := range e.Attributes {
				attrs[string(a.Key)] = a.Value.Emit()
			}
			events[e.Name] = append(events[e.Name], attrs)
		}
	}
	require.Len(t, events["message skipped"], 1)
	require.Equal(t, "a", events["message skipped"][0]["messaging.message.id"])
	require.Equal(t, "1", events["message skipped"][0]["messaging.kafka.offset"])
	require.Equal(t, "duplicate_in_batch", events["message skipped"][0]["kafkaonce.skip_reason"])
	require.Len(t, events["fingerprint conflict"], 1)
	require.Equal(t, "3", events["fingerprint conflict"][0]["messaging.kafka.offset"])
	classes := map[string]string{}
	for _, e := range events["message dead-lettered"] {
		classes[e["messaging.kafka.offset"]] = e["kafkaonce.dead_letter.class"]
	}
	require.Equal(t, map[string]string{"2": "permanent", "3": "conflict"}, classes)

	poison := tr.handlerSpanOf(t, topic, "poison")
	require.Equal(t, "Error", poison.Status.Code.String())
	require.Contains(t, poison.Status.Description, "poison")
}

func TestAMessageWithoutOrWithABadTraceparentGetsTheBatchForParent(t *testing.T) {
	t.Parallel()
	db, k, topic, tr := newSetup(t)
	k.Produce(t, topic, plain("none", "1"),
		plain("garbage", "2", kafka.Header{Key: "traceparent", Value: []byte("00-not-a-trace-01")}),
		plain("zeros", "3", kafka.Header{Key: "traceparent", Value: []byte("00-00000000000000000000000000000000-0000000000000000-01")}))
	h, err := otelhooks.New("ledger", otelhooks.WithTracerProvider(tr.tp))
	require.NoError(t, err)
	run(t, db, k, topic, h, applied(db, tr), func() bool { return effects(t, db) == 3 })
	require.Zero(t, db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")), "trace context never fails a message")

	for _, id := range []string{"none", "garbage", "zeros"} {
		s := tr.handlerSpanOf(t, topic, id)
		require.Empty(t, s.Links, id)
		var batch *tracetest.SpanStub
		for _, b := range tr.named("transaction " + topic) {
			if b.SpanContext.SpanID() == s.Parent.SpanID() {
				batch = &b
			}
		}
		require.NotNil(t, batch, "%s: the handler's span is the batch's child", id)
		require.False(t, batch.Parent.IsValid(), "%s: the batch is a new root", id)
		require.Empty(t, batch.Links, id)
	}
}

// A dead letter keeps the message's headers, trace context included, so
// a redrive's handler span continues the trace the message was written in.
func TestARedriveContinuesTheMessagesTrace(t *testing.T) {
	t.Parallel()
	db, k, topic, tr := newSetup(t)
	m, producer := traced(t, tr, "r")
	k.Produce(t, topic, m)
	h, err := otelhooks.New("ledger", otelhooks.WithTracerProvider(tr.tp))
	require.NoError(t, err)
	handle := applied(db, tr)
	var fixed bool
	c := run(t, db, k, topic, h, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if !fixed {
			return consumer.Permanent(errPoison)
		}
		return handle(ctx, tx, m)
	}, func() bool { return db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")) == 1 })
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")+` WHERE headers::text LIKE '%traceparent%'`),
		"the letter keeps the traceparent")

	fixed = true
	res, err := c.Redrive(context.Background(), consumer.RedriveFilter{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Applied)
	spans := tr.named("process " + topic)
	require.Len(t, spans, 2, "the failed call and the redrive")
	for _, s := range spans {
		require.Equal(t, producer.TraceID(), s.SpanContext.TraceID())
		require.Equal(t, producer.SpanID(), s.Parent.SpanID())
	}
	require.Equal(t, "Error", spans[0].Status.Code.String())
	require.Equal(t, "Unset", spans[1].Status.Code.String())
}

// A transaction cut short at a failing message committed what came before
// it: its span records the cut as an event, not as an error.
func TestACutTransactionIsNotAnError(t *testing.T) {
	t.Parallel()
	db, k, topic, tr := newSetup(t)
	// m1 is set aside, so the batch runs again with m2 onwards in
	// savepoints; m3 then fails once, cutting the transaction after m2.
	k.Produce(t, topic, plain("m0", "0"), plain("m1", "1"), plain("m2", "2"), plain("m3", "3"), plain("m4", "4"))
	h, err := otelhooks.New("ledger", otelhooks.WithTracerProvider(tr.tp))
	require.NoError(t, err)
	handle := applied(db, tr)
	var m3Failed atomic.Bool
	run(t, db, k, topic, h, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "m1":
			return consumer.Permanent(errPoison)
		case m.ID == "m3" && m3Failed.CompareAndSwap(false, true):
			return errors.New("partner API unavailable")
		}
		return handle(ctx, tx, m)
	}, func() bool {
		return effects(t, db) == 4 && db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")) == 1
	})

	var cut []tracetest.SpanStub
	for _, s := range tr.named("transaction " + topic) {
		for _, ev := range s.Events {
			if ev.Name == "message dead-lettered" {
				require.NotEqual(t, "Error", s.Status.Code.String(), "the transaction that committed the dead letter is marked failed: %s", s.Status.Description)
			}
			if ev.Name == "transaction cut" {
				cut = append(cut, s)
			}
		}
	}
	require.Len(t, cut, 1, "one transaction was cut at m3")
}
