package otelhooks_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/otelhooks"
)

// collected is what a ManualReader holds, by instrument name: for each
// series (its attributes, "k=v,..." sorted) the sum or the count of
// observations, or a gauge's last value.
type collected struct {
	units  map[string]string
	series map[string]map[string]float64
}

func collect(t *testing.T, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	c := collected{units: map[string]string{}, series: map[string]map[string]float64{}}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, "github.com/kafkaonce/kafkaonce/otelhooks", sm.Scope.Name)
		for _, m := range sm.Metrics {
			c.units[m.Name] = m.Unit
			s := map[string]float64{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					s[key(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					s[key(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					s[key(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[int64]:
				for _, p := range d.DataPoints {
					s[key(p.Attributes)] = float64(p.Count)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					s[key(p.Attributes)] = float64(p.Count)
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
			c.series[m.Name] = s
		}
	}
	return c
}

func key(set attribute.Set) string {
	var parts []string
	for _, kv := range set.ToSlice() {
		if kv.Key == "kafkaonce.consumer" && kv.Value.AsString() == "ledger" {
			continue // on every series
		}
		parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// The promhooks run, measured through the OpenTelemetry API: every
// instrument, its name, unit and attributes.
func TestMetricsAfterAKnownRun(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	// 6 messages: 4 good (one of them twice), a poison, a flaky one.
	k.Produce(t, topic, plain("a", "1"), plain("b", "2"), plain("a", "1"), plain("poison", "3"), plain("flaky", "4"), plain("c", "5"))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	h, err := otelhooks.New("ledger", otelhooks.WithMeterProvider(mp))
	require.NoError(t, err)
	tr := newTracing(t)
	handle := applied(db, tr)
	var flaked atomic.Bool
	run(t, db, k, topic, h, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "poison":
			return consumer.Permanent(errors.New("bad"))
		case m.ID == "flaky" && !flaked.Swap(true):
			return errors.New("once")
		}
		return handle(ctx, tx, m)
	}, func() bool {
		s := collect(t, reader).series["messaging.client.consumed.messages"]
		return s["kafkaonce.outcome=applied,messaging.destination.name="+topic+",messaging.operation.name=process,messaging.system=kafka"] == 4
	})

	c := collect(t, reader)
	dest := "messaging.destination.name=" + topic
	part := dest + ",messaging.destination.partition.id=0"
	require.Equal(t, map[string]float64{
		"kafkaonce.outcome=applied," + dest + ",messaging.operation.name=process,messaging.system=kafka":                                             4,
		"kafkaonce.outcome=skipped,kafkaonce.skip_reason=duplicate_in_batch," + dest + ",messaging.operation.name=process,messaging.system=kafka":    1,
		"kafkaonce.dead_letter.class=permanent,kafkaonce.outcome=dead_lettered," + dest + ",messaging.operation.name=process,messaging.system=kafka": 1,
	}, c.series["messaging.client.consumed.messages"])
	require.Equal(t, map[string]float64{
		"error.type=permanent,kafkaonce.permanent=true," + dest:          1,
		"error.type=retries_exhausted,kafkaonce.permanent=false," + dest: 1,
	}, c.series["kafkaonce.message.failures"])
	require.Equal(t, map[string]float64{dest: 1}, c.series["kafkaonce.message.retries"])

	// Handler calls: a, b, poison, flaky twice, c at least (a batch that
	// failed runs its messages again).
	var calls, failed float64
	for k, v := range c.series["messaging.process.duration"] {
		calls += v
		if strings.HasPrefix(k, "error.type=_OTHER,") {
			failed += v
		}
	}
	require.GreaterOrEqual(t, calls, 6.0)
	require.GreaterOrEqual(t, failed, 2.0)
	require.Equal(t, "s", c.units["messaging.process.duration"])

	require.Positive(t, c.series["kafkaonce.transaction.duration"]["db.system.name=postgresql,kafkaonce.outcome=committed"])
	require.Positive(t, c.series["kafkaonce.batch.size"][""])
	require.Equal(t, "{message}", c.units["kafkaonce.batch.size"])
	require.Equal(t, 0.0, c.series["kafkaonce.partition.lag"][part])
	require.Positive(t, c.series["kafkaonce.partition.last_commit.timestamp"][part])
	require.Equal(t, 0.0, c.series["kafkaonce.partition.stopped"][part])
	require.Equal(t, 0.0, c.series["kafkaonce.partition.held"][part])
	require.Equal(t, 0.0, c.series["kafkaonce.partition.paused"][part])
	require.Equal(t, 0.0, c.series["kafkaonce.partition.serialized"][part])
	require.Positive(t, c.series["kafkaonce.partition.batch_limit"][part])
	require.Positive(t, c.series["kafkaonce.offset.commits"]["messaging.operation.type=settle,messaging.system=kafka"])

	// Every instrument, whether it saw anything in this run or not.
	var names []string
	for n := range c.series {
		names = append(names, n)
	}
	require.Subset(t, names, []string{"messaging.client.consumed.messages", "kafkaonce.message.failures", "kafkaonce.message.retries",
		"messaging.process.duration", "kafkaonce.transaction.duration", "kafkaonce.batch.size", "kafkaonce.offset.commits",
		"kafkaonce.partition.lag", "kafkaonce.partition.last_commit.timestamp", "kafkaonce.partition.stopped",
		"kafkaonce.partition.held", "kafkaonce.partition.paused", "kafkaonce.partition.batch_limit", "kafkaonce.partition.serialized"})
}

func TestConflictAndSuspectMetrics(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	// x, then x with other content (a conflict), then y with x's key and
	// value (a suspect duplicate).
	y := plain("x", "1")
	y.Headers[0].Value = []byte("y")
	k.Produce(t, topic, plain("x", "1"), plain("x", "2"), y)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	h, err := otelhooks.New("ledger", otelhooks.WithMeterProvider(mp))
	require.NoError(t, err)
	run(t, db, k, topic, h, applied(db, newTracing(t)), func() bool { return effects(t, db) == 2 })
	c := collect(t, reader)
	dest := "messaging.destination.name=" + topic
	require.Equal(t, map[string]float64{dest: 1}, c.series["kafkaonce.messages.conflicting"])
	require.Equal(t, map[string]float64{dest: 1}, c.series["kafkaonce.suspect_duplicates"])
	require.Equal(t, 1.0, c.series["messaging.client.consumed.messages"]["kafkaonce.dead_letter.class=conflict,kafkaonce.outcome=dead_lettered,"+dest+",messaging.operation.name=process,messaging.system=kafka"])
}

// A message set aside to be retried later has its own outcome, not
// dead_lettered, and the gauges of those waiting read the consumer's count.
func TestRetriesLaterAreNotDeadLetters(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	k.Produce(t, topic, plain("later", "1"), plain("ok", "2"))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	h, err := otelhooks.New("ledger", otelhooks.WithMeterProvider(mp))
	require.NoError(t, err)
	before := time.Now()
	handle := func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
		if m.ID == "later" {
			return consumer.RetryLater(errors.New("partner down"), time.Hour)
		}
		return nil
	}
	var c collected
	run(t, db, k, topic, h, handle, func() bool {
		c = collect(t, reader)
		return c.series["kafkaonce.retries.waiting"][""] == 1
	})
	dest := "messaging.destination.name=" + topic
	require.Equal(t, 1.0, c.series["messaging.client.consumed.messages"]["kafkaonce.dead_letter.class=retry_later,kafkaonce.outcome=retry_later,"+dest+",messaging.operation.name=process,messaging.system=kafka"])
	for series := range c.series["messaging.client.consumed.messages"] {
		require.NotContains(t, series, "outcome=dead_lettered")
	}
	due := time.Unix(0, int64(c.series["kafkaonce.retries.next_due.timestamp"][""]*1e9))
	require.WithinDuration(t, before.Add(time.Hour), due, time.Minute)
}

func TestNewRejectsAnEmptyName(t *testing.T) {
	_, err := otelhooks.New("")
	require.ErrorContains(t, err, "consumerName must be the consumer's Config.Name")
}

// A share group's events count by topic and kind.
func TestShareEventMetrics(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	h, err := otelhooks.New("ledger", otelhooks.WithMeterProvider(mp))
	require.NoError(t, err)
	ctx := context.Background()
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareLockLost, Topic: "jobs", Offset: 1})
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareLockLost, Topic: "jobs", Offset: 2})
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareProvisionalWritten, Topic: "jobs", Offset: 3})
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareDelivered, Topic: "jobs", Offset: 4, DeliveryCount: 2})
	c := collect(t, reader)
	require.Equal(t, map[string]float64{"messaging.destination.name=jobs": 1}, c.series["kafkaonce.share.delivery_count"], "one delivery observed")
	require.Equal(t, "{delivery}", c.units["kafkaonce.share.delivery_count"])
	require.Equal(t, "{record}", c.units["kafkaonce.share.events"])
	require.Equal(t, map[string]float64{
		"kafkaonce.share.event=delivered,messaging.destination.name=jobs":           1,
		"kafkaonce.share.event=lock_lost,messaging.destination.name=jobs":           2,
		"kafkaonce.share.event=provisional_written,messaging.destination.name=jobs": 1,
	}, c.series["kafkaonce.share.events"])
}
