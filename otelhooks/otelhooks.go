package otelhooks

import (
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// scopeName names the tracer and the meter: the instrumentation scope.
const scopeName = "github.com/kafkaonce/kafkaonce/otelhooks"

// Hooks traces a consumer's transactions and handler calls and records its
// metrics through the OpenTelemetry API. Pass it in consumer.Config.Hooks.
type Hooks struct {
	tracer   trace.Tracer
	consumer attribute.KeyValue // kafkaonce.consumer
	metrics
}

// An Option changes what New does.
type Option func(*options)

type options struct {
	tp trace.TracerProvider
	mp metric.MeterProvider
}

// WithTracerProvider sets where spans go. Defaults to the global one
// (otel.GetTracerProvider), which drops them until the application sets
// one.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithMeterProvider sets where metrics go. Defaults to the global one
// (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option { return func(o *options) { o.mp = mp } }

// New creates the hooks of one consumer (its Config.Name) and its
// instruments.
func New(consumerName string, opts ...Option) (*Hooks, error) {
	if consumerName == "" {
		return nil, errors.New("otelhooks: consumerName must be the consumer's Config.Name")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	h := &Hooks{tracer: o.tp.Tracer(scopeName), consumer: attrConsumer.String(consumerName)}
	if err := h.metrics.init(o.mp.Meter(scopeName), h.consumer); err != nil {
		return nil, fmt.Errorf("otelhooks: %w", err)
	}
	return h, nil
}

var (
	_ consumer.HookBatchScope          = (*Hooks)(nil)
	_ consumer.HookHandlerScope        = (*Hooks)(nil)
	_ consumer.HookBatchStart          = (*Hooks)(nil)
	_ consumer.HookBatchEnd            = (*Hooks)(nil)
	_ consumer.HookHandlerEnd          = (*Hooks)(nil)
	_ consumer.HookMessageApplied      = (*Hooks)(nil)
	_ consumer.HookMessageSkipped      = (*Hooks)(nil)
	_ consumer.HookFingerprintConflict = (*Hooks)(nil)
	_ consumer.HookMessageDeadLettered = (*Hooks)(nil)
	_ consumer.HookMessageFailed       = (*Hooks)(nil)
	_ consumer.HookSuspectDuplicate    = (*Hooks)(nil)
	_ consumer.HookOffsetsCommitted    = (*Hooks)(nil)
	_ consumer.HookPartitionStopped    = (*Hooks)(nil)
	_ consumer.HookPartitionHeld       = (*Hooks)(nil)
	_ consumer.HookPartitionPaused     = (*Hooks)(nil)
	_ consumer.HookPartitionAssigned   = (*Hooks)(nil)
	_ consumer.HookContention          = (*Hooks)(nil)
	_ consumer.HookShareEvent          = (*Hooks)(nil)
)
