package promhooks

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkaonce/kafkaonce/outbox"
)

// Relay records an outbox relay's activity in Prometheus metrics. Pass it
// in outbox.RelayConfig.Hooks.
//
// The labels are bounded: destination is a topic or a delivery function's
// name, class one of outbox's FailureClass values; never a row's id or an
// error's text.
type Relay struct {
	delivered, errors                *prometheus.CounterVec
	latency                          *prometheus.HistogramVec
	pending, waiting, parked, oldest prometheus.Gauge
}

// NewRelay creates the metrics of one relay and registers them with reg.
// relayName is the relay label, telling relays of different schemas or
// destinations apart: relays that share both report the same backlog.
func NewRelay(reg prometheus.Registerer, relayName string) (*Relay, error) {
	if relayName == "" {
		return nil, errors.New("promhooks: relayName must name the relay (the relay label), e.g. the service that runs it")
	}
	labels := prometheus.Labels{"relay": relayName}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kafkaonce", Subsystem: "outbox", Name: name, Help: help, ConstLabels: labels})
	}
	r := &Relay{
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kafkaonce", Subsystem: "outbox", Name: "delivered_total",
			Help: "Outbox rows delivered, by destination.", ConstLabels: labels}, []string{"destination"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kafkaonce", Subsystem: "outbox", Name: "delivery_errors_total",
			Help: "Failed attempts at outbox rows, by destination, class, and whether the row was parked.", ConstLabels: labels},
			[]string{"destination", "class", "parked"}),
		// From a millisecond-fast relay to rows that waited out an outage
		// of an hour or more.
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kafkaonce", Subsystem: "outbox", Name: "delivery_latency_seconds",
			Help: "Time from an outbox row's creation to its delivery, retries included.", ConstLabels: labels,
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 21)}, []string{"destination"}),
		pending: gauge("pending", "Outbox rows to deliver (waiting ones included), counted up to outbox.BacklogLimit."),
		waiting: gauge("waiting", "Outbox rows waiting for a retry after a failed attempt, counted up to outbox.BacklogLimit."),
		parked:  gauge("parked", "Outbox rows parked until an operator retries them, counted up to outbox.BacklogLimit."),
		oldest:  gauge("oldest_pending_age_seconds", "Age of the oldest outbox row to deliver; 0 when none is."),
	}
	for _, c := range []prometheus.Collector{r.delivered, r.errors, r.latency, r.pending, r.waiting, r.parked, r.oldest} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("promhooks: register: %w", err)
		}
	}
	return r, nil
}

var (
	_ outbox.HookDelivered      = (*Relay)(nil)
	_ outbox.HookDeliveryFailed = (*Relay)(nil)
	_ outbox.HookBacklog        = (*Relay)(nil)
)

func (r *Relay) OnDelivered(_ context.Context, d outbox.Delivered) {
	r.delivered.WithLabelValues(d.Destination).Inc()
	r.latency.WithLabelValues(d.Destination).Observe(d.Latency.Seconds())
}

func (r *Relay) OnDeliveryFailed(_ context.Context, f outbox.DeliveryFailed) {
	r.errors.WithLabelValues(f.Destination, string(f.Class), strconv.FormatBool(f.Parked)).Inc()
}

func (r *Relay) OnBacklog(_ context.Context, b outbox.Backlog) {
	r.pending.Set(float64(b.Pending))
	r.waiting.Set(float64(b.Waiting))
	r.parked.Set(float64(b.Parked))
	r.oldest.Set(b.OldestPendingAge.Seconds())
}
