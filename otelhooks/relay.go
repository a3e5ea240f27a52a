package otelhooks

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/kafkaonce/kafkaonce/outbox"
)

// Relay records an outbox relay's metrics through the OpenTelemetry API:
// promhooks.NewRelay's, one for one, as kafkaonce.outbox.*. Pass it in
// outbox.RelayConfig.Hooks. The messaging conventions' producer metrics
// do not fit: a relay's destination may be a function (an HTTP API), not
// a broker. Attributes stay bounded: a destination and a failure class,
// never a row's id or an error's text.
type Relay struct {
	delivered, errors        metric.Int64Counter
	latency                  metric.Float64Histogram
	pending, waiting, parked metric.Int64Gauge
	oldest                   metric.Float64Gauge
	base                     attribute.KeyValue // kafkaonce.relay
	backlogAttrs             metric.MeasurementOption
}

// NewRelay creates the instruments of one relay; relayName is its
// kafkaonce.relay attribute. Of the options, only WithMeterProvider
// matters: a relay is not traced.
func NewRelay(relayName string, opts ...Option) (*Relay, error) {
	if relayName == "" {
		return nil, errors.New("otelhooks: relayName must name the relay (the kafkaonce.relay attribute), e.g. the service that runs it")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	meter := o.mp.Meter(scopeName)
	r := &Relay{base: attrRelay.String(relayName)}
	r.backlogAttrs = metric.WithAttributeSet(attribute.NewSet(r.base))
	var err error
	gauge := func(name, desc string) metric.Int64Gauge {
		g, e := meter.Int64Gauge(name, metric.WithUnit("{row}"), metric.WithDescription(desc))
		err = firstErr(err, e)
		return g
	}
	var e error
	r.delivered, e = meter.Int64Counter("kafkaonce.outbox.delivered", metric.WithUnit("{row}"), metric.WithDescription("Outbox rows delivered, by destination."))
	err = firstErr(err, e)
	r.errors, e = meter.Int64Counter("kafkaonce.outbox.delivery.errors", metric.WithUnit("{failure}"),
		metric.WithDescription("Failed attempts at outbox rows, by destination, class (error.type), and whether the row was parked."))
	err = firstErr(err, e)
	r.latency, e = meter.Float64Histogram("kafkaonce.outbox.delivery.latency", metric.WithUnit("s"),
		metric.WithDescription("Time from an outbox row's creation to its delivery, retries included."),
		metric.WithExplicitBucketBoundaries(exponential(0.005, 21)...))
	err = firstErr(err, e)
	r.pending = gauge("kafkaonce.outbox.pending", "Outbox rows to deliver (waiting ones included), counted up to outbox.BacklogLimit.")
	r.waiting = gauge("kafkaonce.outbox.waiting", "Outbox rows waiting for a retry after a failed attempt, counted up to outbox.BacklogLimit.")
	r.parked = gauge("kafkaonce.outbox.parked", "Outbox rows parked until an operator retries them, counted up to outbox.BacklogLimit.")
	r.oldest, e = meter.Float64Gauge("kafkaonce.outbox.oldest_pending.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest outbox row to deliver; 0 when none is."))
	if err = firstErr(err, e); err != nil {
		return nil, fmt.Errorf("otelhooks: %w", err)
	}
	return r, nil
}

var (
	_ outbox.HookDelivered      = (*Relay)(nil)
	_ outbox.HookDeliveryFailed = (*Relay)(nil)
	_ outbox.HookBacklog        = (*Relay)(nil)
)

func (r *Relay) OnDelivered(ctx context.Context, d outbox.Delivered) {
	attrs := metric.WithAttributes(r.base, attrDestination.String(d.Destination))
	r.delivered.Add(ctx, 1, attrs)
	r.latency.Record(ctx, d.Latency.Seconds(), attrs)
}

func (r *Relay) OnDeliveryFailed(ctx context.Context, f outbox.DeliveryFailed) {
	r.errors.Add(ctx, 1, metric.WithAttributes(r.base, attrDestination.String(f.Destination), errTypeKey.String(string(f.Class)), attrParked.Bool(f.Parked)))
}

func (r *Relay) OnBacklog(ctx context.Context, b outbox.Backlog) {
	r.pending.Record(ctx, b.Pending, r.backlogAttrs)
	r.waiting.Record(ctx, b.Waiting, r.backlogAttrs)
	r.parked.Record(ctx, b.Parked, r.backlogAttrs)
	r.oldest.Record(ctx, b.OldestPendingAge.Seconds(), r.backlogAttrs)
}
