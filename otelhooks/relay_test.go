package otelhooks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/otelhooks"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// relayMetrics writes msgs, then runs a relay of db's outbox with the
// otelhooks relay hooks on a manual reader until the test ends.
func relayMetrics(t *testing.T, db *testenv.DB, cfg outbox.RelayConfig, msgs ...outbox.Message) *sdkmetric.ManualReader {
	t.Helper()
	o, err := outbox.New(db.Schema)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(context.Background(), db.Pool, func(tx pgx.Tx) error {
		_, err := o.Write(context.Background(), tx, msgs...)
		return err
	}))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	h, err := otelhooks.NewRelay("notifier", otelhooks.WithMeterProvider(mp))
	require.NoError(t, err)
	cfg.Schema, cfg.Logger, cfg.Hooks, cfg.BacklogInterval = db.Schema, quiet, []outbox.Hook{h}, 20*time.Millisecond
	r, err := outbox.NewRelay(db.Pool, &cfg)
	require.NoError(t, err)
	testenv.Background(t, r.Run)
	return reader
}

func waitCollected(t *testing.T, reader *sdkmetric.ManualReader, cond func(c collected) bool, what string) collected {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := collect(t, reader)
		if cond(c) {
			return c
		}
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(20 * time.Millisecond)
	}
}

// Rows published to Kafka count as delivered, with their latency, and the
// backlog gauges read 0 once they are gone.
func TestRelayMetricsOfDeliveriesToKafka(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	reader := relayMetrics(t, db, outbox.RelayConfig{Brokers: k.Brokers},
		outbox.Message{Destination: topic, Key: []byte("a")}, outbox.Message{Destination: topic, Key: []byte("b")})
	dest := "kafkaonce.outbox.destination=" + topic + ",kafkaonce.relay=notifier"
	c := waitCollected(t, reader, func(c collected) bool {
		return c.series["kafkaonce.outbox.delivered"][dest] == 2 && c.series["kafkaonce.outbox.pending"]["kafkaonce.relay=notifier"] == 0 &&
			c.series["kafkaonce.outbox.oldest_pending.age"]["kafkaonce.relay=notifier"] == 0 && len(c.series["kafkaonce.outbox.pending"]) == 1
	}, "2 rows delivered and the backlog at 0")
	require.Equal(t, map[string]float64{dest: 2}, c.series["kafkaonce.outbox.delivery.latency"])
	require.Equal(t, "s", c.units["kafkaonce.outbox.delivery.latency"])
	require.Equal(t, map[string]float64{"kafkaonce.relay=notifier": 0}, c.series["kafkaonce.outbox.parked"])
	require.Equal(t, map[string]float64{"kafkaonce.relay=notifier": 0}, c.series["kafkaonce.outbox.waiting"])
	require.Empty(t, c.series["kafkaonce.outbox.delivery.errors"])
}

// A delivery function that keeps failing counts an error per attempt, by
// class, the last one parked, and the row then shows in the parked gauge.
func TestRelayMetricsOfAFailingDeliveryThenParked(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	reader := relayMetrics(t, db, outbox.RelayConfig{
		Deliver:     func(context.Context, *outbox.Delivery) error { return errors.New("partner down") },
		MaxAttempts: 2, RetryInitialInterval: time.Millisecond, RetryMaxInterval: time.Millisecond,
	}, outbox.Message{Destination: "partner", Key: []byte("a")})
	c := waitCollected(t, reader, func(c collected) bool {
		return c.series["kafkaonce.outbox.parked"]["kafkaonce.relay=notifier"] == 1
	}, "the row parked")
	require.Equal(t, map[string]float64{
		"error.type=other,kafkaonce.outbox.destination=partner,kafkaonce.outbox.parked=false,kafkaonce.relay=notifier": 1,
		"error.type=other,kafkaonce.outbox.destination=partner,kafkaonce.outbox.parked=true,kafkaonce.relay=notifier":  1,
	}, c.series["kafkaonce.outbox.delivery.errors"])
	require.Equal(t, 0.0, c.series["kafkaonce.outbox.pending"]["kafkaonce.relay=notifier"])
}

func TestNewRelayRejectsAnEmptyName(t *testing.T) {
	_, err := otelhooks.NewRelay("")
	require.ErrorContains(t, err, "relayName must name the relay")
}
