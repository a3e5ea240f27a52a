package promhooks_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
	"github.com/kafkaonce/kafkaonce/promhooks"
)

// relayMetrics runs a relay of db's outbox with promhooks on a registry
// of its own until the test ends.
func relayMetrics(t *testing.T, db *testenv.DB, cfg outbox.RelayConfig) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := promhooks.NewRelay(reg, "notifier")
	require.NoError(t, err)
	cfg.Schema, cfg.Logger, cfg.Hooks, cfg.BacklogInterval = db.Schema, slog.New(slog.NewTextHandler(io.Discard, nil)), []outbox.Hook{m}, 20*time.Millisecond
	r, err := outbox.NewRelay(db.Pool, &cfg)
	require.NoError(t, err)
	testenv.Background(t, r.Run)
	return reg
}

func writeRows(t *testing.T, db *testenv.DB, msgs ...outbox.Message) {
	t.Helper()
	o, err := outbox.New(db.Schema)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		_, err := o.Write(context.Background(), tx, msgs...)
		return err
	}))
}

// Rows published to Kafka count as delivered, by topic, with their
// latency, and no errors.
func TestRelayMetricsOfDeliveriesToKafka(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	writeRows(t, db, outbox.Message{Destination: topic, Key: []byte("a")}, outbox.Message{Destination: topic, Key: []byte("b")},
		outbox.Message{Destination: topic, Key: []byte("a")})
	reg := relayMetrics(t, db, outbox.RelayConfig{Brokers: k.Brokers})
	waitGauge(t, reg, "kafkaonce_outbox_delivered_total", 3, "3 rows delivered")
	require.NoError(t, testutil.GatherAndCompare(reg, stringsReader(`
# HELP kafkaonce_outbox_delivered_total Outbox rows delivered, by destination.
# TYPE kafkaonce_outbox_delivered_total counter
kafkaonce_outbox_delivered_total{destination="`+topic+`",relay="notifier"} 3
`), "kafkaonce_outbox_delivered_total", "kafkaonce_outbox_delivery_errors_total"))
	require.Equal(t, uint64(3), histogramCount(t, reg, "kafkaonce_outbox_delivery_latency_seconds"))
}

// While a receiver holds its rows the gauges show them, and their age;
// once it lets them through they fall to 0.
func TestRelayBacklogGaugesFallWhenDrained(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	writeRows(t, db, outbox.Message{Destination: "partner", Key: []byte("a")}, outbox.Message{Destination: "partner", Key: []byte("b")})
	open := make(chan struct{})
	reg := relayMetrics(t, db, outbox.RelayConfig{Deliver: func(ctx context.Context, _ *outbox.Delivery) error {
		select {
		case <-open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	waitGauge(t, reg, "kafkaonce_outbox_pending", 2, "both rows pending")
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(counterWith(t, reg, "kafkaonce_outbox_oldest_pending_age_seconds")) <= 0 {
		require.True(t, time.Now().Before(deadline), "the oldest row's age reported")
		time.Sleep(20 * time.Millisecond)
	}
	close(open)
	waitGauge(t, reg, "kafkaonce_outbox_delivered_total", 2, "both rows delivered")
	waitGauge(t, reg, "kafkaonce_outbox_pending", 0, "the backlog drained")
	waitGauge(t, reg, "kafkaonce_outbox_oldest_pending_age_seconds", 0, "no oldest row")
	require.Equal(t, uint64(2), histogramCount(t, reg, "kafkaonce_outbox_delivery_latency_seconds"))
}

// A delivery function that keeps failing counts an error per attempt, the
// last one parked, and the row then shows in the parked gauge.
func TestRelayMetricsOfAFailingDeliveryThenParked(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	writeRows(t, db, outbox.Message{Destination: "partner", Key: []byte("a")})
	reg := relayMetrics(t, db, outbox.RelayConfig{
		Deliver:     func(context.Context, *outbox.Delivery) error { return errors.New("partner down: request 7f3a failed") },
		MaxAttempts: 3, RetryInitialInterval: time.Millisecond, RetryMaxInterval: time.Millisecond,
	})
	waitGauge(t, reg, "kafkaonce_outbox_parked", 1, "the row parked")
	waitGauge(t, reg, "kafkaonce_outbox_pending", 0, "nothing left to deliver")
	require.NoError(t, testutil.GatherAndCompare(reg, stringsReader(`
# HELP kafkaonce_outbox_delivery_errors_total Failed attempts at outbox rows, by destination, class, and whether the row was parked.
# TYPE kafkaonce_outbox_delivery_errors_total counter
kafkaonce_outbox_delivery_errors_total{class="other",destination="partner",parked="false",relay="notifier"} 2
kafkaonce_outbox_delivery_errors_total{class="other",destination="partner",parked="true",relay="notifier"} 1
`), "kafkaonce_outbox_delivery_errors_total", "kafkaonce_outbox_delivered_total"))
}

func TestNewRelayRejectsAnEmptyName(t *testing.T) {
	t.Parallel()
	_, err := promhooks.NewRelay(prometheus.NewRegistry(), "")
	require.ErrorContains(t, err, "relayName")
}
