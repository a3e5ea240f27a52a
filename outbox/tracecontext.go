package outbox

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Trace context travels with a row: Write stores the W3C Trace Context of
// the span in its ctx (an HTTP request's, under otelhttp; the handler's,
// under a tracing hook) among the row's headers, and the relay publishes
// them as they are, so the consumer's span is a child of the span that
// wrote the row, whatever happened in between: a relay down for an hour,
// a retry, a redelivery. Always W3C, whatever the global propagator: it is
// what the receiving side (package otelhooks, or any OpenTelemetry Kafka
// instrumentation) reads. A row whose headers already carry traceparent
// keeps them: the caller chose its parent.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

var w3c propagation.TraceContext

// withTraceContext returns h with the trace context of ctx added, or h
// itself when ctx has no span or h already names a parent.
func withTraceContext(ctx context.Context, h []Header) []Header {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return h
	}
	for _, x := range h {
		if x.Key == HeaderTraceParent {
			return h
		}
	}
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	// A copy: the caller's slice is not ours to append to.
	out := make([]Header, len(h), len(h)+2)
	copy(out, h)
	for _, k := range [...]string{HeaderTraceParent, HeaderTraceState} {
		if v := c[k]; v != "" {
			out = append(out, Header{Key: k, Value: []byte(v)})
		}
	}
	return out
}
