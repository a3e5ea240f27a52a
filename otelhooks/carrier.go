package otelhooks

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// w3c reads the W3C Trace Context that outbox.Write and the dead-letter
// table carry (traceparent, tracestate), whatever the global propagator:
// the writers always write it.
var w3c propagation.TraceContext

// headers lets the propagator read a message's headers. The last header of
// a name wins, as Message.Header has it.
type headers struct{ m *consumer.Message }

func (h headers) Get(key string) string {
	v, _ := h.m.Header(key)
	return string(v)
}

func (headers) Set(string, string) {} // never written: extraction only

func (h headers) Keys() []string {
	keys := make([]string, len(h.m.Headers))
	for i, x := range h.m.Headers {
		keys[i] = x.Key
	}
	return keys
}

// producerOf returns the span context the message was written under: that
// of the span whose trace context it carries. It is invalid when the
// message carries none, or one that does not parse: a message is never
// failed over its trace context.
func producerOf(m *consumer.Message) trace.SpanContext {
	if _, ok := m.Header("traceparent"); !ok {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), headers{m}))
}
