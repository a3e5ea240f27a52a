package otelhooks_test

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/otelhooks"
)

// The hooks go in the consumer's Config.Hooks. Here they are called as the
// consumer calls them, for one message written under a request's span:
// the handler's span is that span's child, and the transaction's span
// links to it.
func Example() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)) // your exporter here
	h, err := otelhooks.New("ledger", otelhooks.WithTracerProvider(tp))
	if err != nil {
		panic(err)
	}
	cfg := &consumer.Config{Name: "ledger", Hooks: []consumer.Hook{h}} // and the rest
	_ = cfg

	// What outbox.Write does with a request's span: its traceparent
	// travels with the message.
	reqCtx, req := tp.Tracer("http").Start(context.Background(), "POST /orders")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(reqCtx, carrier)
	req.End()
	msg := &consumer.Message{ID: "order-1", Topic: "orders", Headers: []consumer.Header{{Key: "traceparent", Value: []byte(carrier["traceparent"])}}}

	ctx, endBatch := h.ScopeBatch(context.Background(), consumer.BatchInfo{Topic: "orders", Size: 1}, []*consumer.Message{msg})
	_, endCall := h.ScopeHandler(ctx, msg) // the handler runs with this ctx
	endCall(nil)
	endBatch()

	spans := exp.GetSpans()
	request, handler, batch := spans[0], spans[1], spans[2]
	fmt.Println(handler.Name, "is a child of", request.Name+":", handler.Parent.SpanID() == request.SpanContext.SpanID())
	fmt.Println(batch.Name, "links to", request.Name+":", batch.Links[0].SpanContext.SpanID() == request.SpanContext.SpanID())
	// Output:
	// process orders is a child of POST /orders: true
	// transaction orders links to POST /orders: true
}
