package otelhooks

import (
	"context"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// Spans. A batch transaction covers messages written under many traces,
// so its span ("transaction <topic>") is a root with a link to each distinct
// producer span: a span has one parent, and none of them is the batch's.
// A handler call for one message is that message's: its span ("process
// <topic>") is a child of the span that wrote the message (the
// traceparent header) and links to the batch's span; a message without
// trace context, or with one that does not parse, gets the batch's span
// for parent instead. A BatchHandler called for several messages runs in
// the batch's span. What happens to single messages inside the batch
// (skipped as duplicates, set aside, their id in conflict) are events on
// the batch's span.

// ScopeBatch starts the batch transaction's span.
func (h *Hooks) ScopeBatch(ctx context.Context, b consumer.BatchInfo, msgs []*consumer.Message) (context.Context, func()) {
	ctx, span := h.tracer.Start(ctx, "transaction "+b.Topic,
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(producerLinks(msgs)...),
		trace.WithAttributes(kafka, processing, opNameKey.String("transaction"), postgres, h.consumer,
			topicKey.String(b.Topic), partKey.String(strconv.Itoa(b.Partition)), countKey.Int(b.Size),
			attrFirstOffset.Int64(b.FirstOffset), attrLastOffset.Int64(b.LastOffset), attrAttempt.Int(b.Attempt)))
	return ctx, func() { span.End() }
}

// maxLinks bounds the links of a batch's span: the SDK's default limit,
// which drops the rest. Reading no further than that keeps a batch of
// thousands of traces from paying for links nobody keeps.
const maxLinks = 128

// producerLinks links to each distinct producer span of msgs, the first
// maxLinks of them: a batch written in one request holds one.
func producerLinks(msgs []*consumer.Message) []trace.Link {
	var links []trace.Link
	var seen map[[24]byte]bool
	for _, m := range msgs {
		if len(links) == maxLinks {
			break
		}
		sc := producerOf(m)
		if !sc.IsValid() {
			continue
		}
		var k [24]byte
		tid, sid := sc.TraceID(), sc.SpanID()
		copy(k[:16], tid[:])
		copy(k[16:], sid[:])
		if seen == nil {
			seen = map[[24]byte]bool{}
		}
		if !seen[k] {
			seen[k] = true
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	return links
}

// ScopeHandler starts the span of one handler call.
func (h *Hooks) ScopeHandler(ctx context.Context, m *consumer.Message) (context.Context, func(error)) {
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(kafka, processing, opNameKey.String("process"), h.consumer,
			topicKey.String(m.Topic), partKey.String(strconv.Itoa(m.Partition)), offsetKey.Int64(m.Offset), idKey.String(m.ID))}
	if p := producerOf(m); p.IsValid() {
		if batch := trace.SpanContextFromContext(ctx); batch.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: batch}))
		}
		ctx = trace.ContextWithRemoteSpanContext(ctx, p)
	}
	ctx, span := h.tracer.Start(ctx, "process "+m.Topic, opts...)
	return ctx, func(err error) {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}

// endBatchSpan notes a transaction's result on its span, which ends with
// its scope, after the events of the messages it committed.
func endBatchSpan(ctx context.Context, r consumer.BatchResult) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(attrApplied.Int(r.Applied), attrSkipped.Int(r.Skipped))
	switch {
	case r.Err != nil && r.Committed > 0:
		// Cut at a failing message: what came before it committed, and
		// the failure is the next transaction's to retry.
		span.AddEvent("transaction cut", trace.WithAttributes(attribute.Int("kafkaonce.committed", r.Committed),
			attribute.String("exception.message", r.Err.Error())))
	case r.Err != nil:
		span.RecordError(r.Err)
		span.SetStatus(codes.Error, r.Err.Error())
	}
}

// event adds an event to the span in ctx, the batch's.
func event(ctx context.Context, name string, attrs ...attribute.KeyValue) {
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

func msgAttrs(m *consumer.Message, extra ...attribute.KeyValue) []attribute.KeyValue {
	return append([]attribute.KeyValue{idKey.String(m.ID), offsetKey.Int64(m.Offset)}, extra...)
}

func (h *Hooks) skippedEvent(ctx context.Context, m *consumer.Message, reason consumer.SkipReason) {
	event(ctx, "message skipped", msgAttrs(m, attrSkipReason.String(string(reason)))...)
}

func (h *Hooks) deadEvent(ctx context.Context, m *consumer.Message, l consumer.DeadLettered) {
	attrs := msgAttrs(m, attrClass.String(string(l.Class)), attrAttempt.Int(l.Attempts))
	if l.Err != nil {
		attrs = append(attrs, attrError.String(l.Err.Error()))
	}
	if l.Class == deadletter.ClassRetryLater {
		event(ctx, "message set aside to retry later", attrs...)
		return
	}
	event(ctx, "message dead-lettered", attrs...)
}

func (h *Hooks) conflictEvent(ctx context.Context, err *consumer.FingerprintConflictError) {
	event(ctx, "fingerprint conflict", idKey.String(err.MessageID), offsetKey.Int64(err.Offset), attrError.String(err.Error()))
}

func (h *Hooks) contentionEvent(ctx context.Context, c consumer.Contention) {
	attrs := []attribute.KeyValue{attrBatchLimit.Int(c.BatchLimit), attrSerialized.Bool(c.Serialized)}
	if c.Err != nil {
		attrs = append(attrs, attrError.String(c.Err.Error()))
	}
	event(ctx, "contention", attrs...)
}
