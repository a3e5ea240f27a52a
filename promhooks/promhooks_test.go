package promhooks_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/pauses"
	"github.com/kafkaonce/kafkaonce/promhooks"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestMetricsAfterAKnownRun(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	m := func(id, v string) kafka.Message {
		return kafka.Message{Key: []byte(id), Value: []byte(v), Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}}
	}
	// 6 messages: 4 good (one of them twice), a poison, a flaky one.
	k.Produce(t, topic, m("a", "1"), m("b", "2"), m("a", "1"), m("poison", "3"), m("flaky", "4"), m("c", "5"))

	reg := prometheus.NewPedanticRegistry()
	hooks, err := promhooks.New(reg, "ledger")
	require.NoError(t, err)
	var flaked atomic.Bool
	c, err := consumer.New(db.Pool, &consumer.Config{
		Name: "ledger", GroupID: testenv.Name(t, "g"), Brokers: k.Brokers, Topics: []string{topic}, Schema: db.Schema,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, Retry: consumer.RetryPolicy{InitialInterval: time.Millisecond},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			switch {
			case msg.ID == "poison":
				return consumer.Permanent(errors.New("bad"))
			case msg.ID == "flaky" && !flaked.Swap(true):
				return errors.New("once")
			}
			return nil
		}),
		Hooks: []consumer.Hook{hooks},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(counterWith(t, reg, "kafkaonce_messages_applied_total")) < 4 {
		require.True(t, time.Now().Before(deadline), "timed out waiting for the run")
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)

	require.NoError(t, testutil.GatherAndCompare(reg, stringsReader(`
# HELP kafkaonce_messages_applied_total Messages whose effects committed.
# TYPE kafkaonce_messages_applied_total counter
kafkaonce_messages_applied_total{consumer="ledger",topic="`+topic+`"} 4
# HELP kafkaonce_messages_dead_lettered_total Messages set aside in dead_letters for an operator, by class (not those set aside to be retried later).
# TYPE kafkaonce_messages_dead_lettered_total counter
kafkaonce_messages_dead_lettered_total{class="permanent",consumer="ledger",topic="`+topic+`"} 1
# HELP kafkaonce_messages_skipped_total Messages skipped as duplicates, by reason.
# TYPE kafkaonce_messages_skipped_total counter
kafkaonce_messages_skipped_total{consumer="ledger",reason="duplicate_in_batch",topic="`+topic+`"} 1
# HELP kafkaonce_message_retries_total Failed attempts that will be retried.
# TYPE kafkaonce_message_retries_total counter
kafkaonce_message_retries_total{consumer="ledger",topic="`+topic+`"} 1
# HELP kafkaonce_message_failures_total Failed attempts at messages, by class.
# TYPE kafkaonce_message_failures_total counter
kafkaonce_message_failures_total{class="permanent",consumer="ledger",permanent="true",topic="`+topic+`"} 1
kafkaonce_message_failures_total{class="retries_exhausted",consumer="ledger",permanent="false",topic="`+topic+`"} 1
# HELP kafkaonce_partition_lag Records the consumer has yet to apply: the log end it last saw minus its position, which passes transaction markers and aborted records.
# TYPE kafkaonce_partition_lag gauge
kafkaonce_partition_lag{consumer="ledger",partition="0",topic="`+topic+`"} 0
# HELP kafkaonce_partition_batch_limit Most messages the partition's next transaction covers: MaxBatch, or less under contention.
# TYPE kafkaonce_partition_batch_limit gauge
kafkaonce_partition_batch_limit{consumer="ledger",partition="0",topic="`+topic+`"} 1000
# HELP kafkaonce_partition_serialized 1 while the partition's transactions wait their turn at the consumer's gate because of contention.
# TYPE kafkaonce_partition_serialized gauge
kafkaonce_partition_serialized{consumer="ledger",partition="0",topic="`+topic+`"} 0
`), "kafkaonce_messages_applied_total", "kafkaonce_messages_dead_lettered_total", "kafkaonce_messages_skipped_total",
		"kafkaonce_message_retries_total", "kafkaonce_message_failures_total", "kafkaonce_partition_lag",
		"kafkaonce_partition_batch_limit", "kafkaonce_partition_serialized", "kafkaonce_contention_retries_total"))

	// Every handler call was timed (5 calls in the first batch before the
	// poison rolled it back, then re-runs); every commit reached Kafka.
	require.GreaterOrEqual(t, histogramCount(t, reg, "kafkaonce_handler_duration_seconds"), uint64(6))
	require.GreaterOrEqual(t, testutil.ToFloat64(counterWith(t, reg, "kafkaonce_offset_commits_total")), 1.0)
	require.Zero(t, testutil.ToFloat64(counterWith(t, reg, "kafkaonce_offset_commit_errors_total")))
}

// The consumer's contention tests make real deadlocks (see
// consumer/contention_test.go); here, what the hooks they call record.
func TestContentionMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	h, err := promhooks.New(reg, "ledger")
	require.NoError(t, err)
	ctx := context.Background()
	b := consumer.BatchInfo{Topic: "transfers", Partition: 3, Size: 1000, BatchLimit: 1000}
	h.OnBatchStart(ctx, b)
	h.OnContention(ctx, b, consumer.Contention{Err: errors.New("deadlock detected"), BatchLimit: 500, Serialized: true})
	b.Size, b.BatchLimit, b.Serialized = 500, 500, true
	h.OnBatchStart(ctx, b)
	h.OnContention(ctx, b, consumer.Contention{Err: errors.New("deadlock detected"), BatchLimit: 250, Serialized: true})
	require.NoError(t, testutil.GatherAndCompare(reg, stringsReader(`
# HELP kafkaonce_contention_retries_total Batch transactions that lost a race for rows (deadlock, serialization failure, lock timeout) and ran again.
# TYPE kafkaonce_contention_retries_total counter
kafkaonce_contention_retries_total{consumer="ledger",partition="3",topic="transfers"} 2
# HELP kafkaonce_partition_batch_limit Most messages the partition's next transaction covers: MaxBatch, or less under contention.
# TYPE kafkaonce_partition_batch_limit gauge
kafkaonce_partition_batch_limit{consumer="ledger",partition="3",topic="transfers"} 250
# HELP kafkaonce_partition_serialized 1 while the partition's transactions wait their turn at the consumer's gate because of contention.
# TYPE kafkaonce_partition_serialized gauge
kafkaonce_partition_serialized{consumer="ledger",partition="3",topic="transfers"} 1
`), "kafkaonce_contention_retries_total", "kafkaonce_partition_batch_limit", "kafkaonce_partition_serialized"))
}

func TestNewRejectsAnEmptyName(t *testing.T) {
	t.Parallel()
	_, err := promhooks.New(prometheus.NewRegistry(), "")
	require.ErrorContains(t, err, "consumerName")
}

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

// counterWith sums a counter's or a gauge's samples (all label values).
func counterWith(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return gathered{reg: reg, name: name}
}

type gathered struct {
	reg  *prometheus.Registry
	name string
}

func (g gathered) Describe(ch chan<- *prometheus.Desc) {}
func (g gathered) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != g.name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "sum", nil, nil), prometheus.CounterValue, sum)
}

func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}

// gaugeConsumer runs a consumer of topic, whose handler does nothing,
// with promhooks on reg, until the test ends.
func gaugeConsumer(t *testing.T, db *testenv.DB, k *testenv.Kafka, topic string) (*prometheus.Registry, *consumer.Consumer) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	hooks, err := promhooks.New(reg, "ledger")
	require.NoError(t, err)
	c, err := consumer.New(db.Pool, &consumer.Config{
		Name: "ledger", GroupID: testenv.Name(t, "g"), Brokers: k.Brokers, Topics: []string{topic}, Schema: db.Schema,
		OpenTransactionAfter: 200 * time.Millisecond, SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		Hooks:   []consumer.Hook{hooks},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return reg, c
}

// waitGauge waits until the gauge name reads want.
func waitGauge(t *testing.T, reg *prometheus.Registry, name string, want float64, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(counterWith(t, reg, name)) != want {
		require.True(t, time.Now().Before(deadline), what)
		time.Sleep(20 * time.Millisecond)
	}
}

// A message set aside to be retried later is counted apart from dead
// letters, and the gauge of those waiting reads the consumer's count, with
// when the first is due.
func TestRetriesLaterAreNotDeadLetters(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	m := func(id string) kafka.Message {
		return kafka.Message{Value: []byte(id), Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}}
	}
	k.Produce(t, topic, m("later-1"), m("later-2"), m("poison"), m("ok"))

	reg := prometheus.NewPedanticRegistry()
	hooks, err := promhooks.New(reg, "ledger")
	require.NoError(t, err)
	c, err := consumer.New(db.Pool, &consumer.Config{
		Name: "ledger", GroupID: testenv.Name(t, "g"), Brokers: k.Brokers, Topics: []string{topic}, Schema: db.Schema,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
			switch m.ID {
			case "later-1", "later-2":
				return consumer.RetryLater(errors.New("partner down"), time.Hour)
			case "poison":
				return consumer.Permanent(errors.New("malformed"))
			}
			return nil
		}),
		Hooks: []consumer.Hook{hooks},
	})
	require.NoError(t, err)
	before := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	waitGauge(t, reg, "kafkaonce_retries_waiting", 2, "the gauge never counted the two messages waiting to be retried")
	require.Equal(t, 2.0, testutil.ToFloat64(counterWith(t, reg, "kafkaonce_messages_set_aside_to_retry_total")))
	require.Equal(t, 1.0, testutil.ToFloat64(counterWith(t, reg, "kafkaonce_messages_dead_lettered_total")), "only the poison is a dead letter")
	due := time.Unix(0, int64(testutil.ToFloat64(counterWith(t, reg, "kafkaonce_retries_next_due_timestamp_seconds"))*1e9))
	require.WithinDuration(t, before.Add(time.Hour), due, time.Minute)
}

// A message set aside for later whose retries run out is an ordinary dead
// letter from then on, waiting for an operator: the dead letters' counter
// counts it then, and the gauge of those waiting no longer does.
func TestARetryLaterWhoseRetriesRunOutIsADeadLetter(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	k.Produce(t, topic, kafka.Message{Value: []byte("x"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("flaky")}}})

	reg := prometheus.NewPedanticRegistry()
	hooks, err := promhooks.New(reg, "ledger")
	require.NoError(t, err)
	c, err := consumer.New(db.Pool, &consumer.Config{
		Name: "ledger", GroupID: testenv.Name(t, "g"), Brokers: k.Brokers, Topics: []string{topic}, Schema: db.Schema,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		RetryLater: consumer.RetryLaterPolicy{MaxRetries: 1},
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
			return consumer.RetryLater(errors.New("partner down"), 10*time.Millisecond)
		}),
		Hooks: []consumer.Hook{hooks},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	deadline := time.Now().Add(45 * time.Second)
	for db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")+` WHERE error_class = 'retries_exhausted'`) == 0 {
		require.True(t, time.Now().Before(deadline), "the retry never ran out")
		time.Sleep(50 * time.Millisecond)
	}
	require.Equal(t, 1.0, testutil.ToFloat64(counterWith(t, reg, "kafkaonce_messages_set_aside_to_retry_total")))
	waitGauge(t, reg, "kafkaonce_retries_waiting", 0, "the message whose retries ran out stays in the gauge of those waiting")
	require.Equal(t, 1.0, testutil.ToFloat64(counterWith(t, reg, "kafkaonce_messages_dead_lettered_total")),
		"the message is a dead letter (retries_exhausted), waiting for an operator")
}

// kafkaonce_partition_held is 1 while a producer's open transaction holds
// the partition back, and 0 once it ended.
func TestHeldMetric(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	tx, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.TransactionalID(testenv.Name(t, "tx")), kgo.DefaultProduceTopic(topic))
	require.NoError(t, err)
	defer tx.Close()
	require.NoError(t, tx.BeginTransaction())
	require.NoError(t, tx.ProduceSync(context.Background(), &kgo.Record{Value: []byte("v"), Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte("m")}}}).FirstErr())

	reg, _ := gaugeConsumer(t, db, k, topic)
	waitGauge(t, reg, "kafkaonce_partition_held", 1, "the partition never showed as held")
	require.NoError(t, tx.EndTransaction(context.Background(), kgo.TryCommit))
	waitGauge(t, reg, "kafkaonce_partition_held", 0, "the partition still showed as held after the transaction ended")
}

// kafkaonce_partition_paused is 1 while a pause holds the partition, and
// 0 once it is resumed.
func TestPausedMetric(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	reg, c := gaugeConsumer(t, db, k, topic)
	ctx := context.Background()
	require.NoError(t, c.Pause(ctx, pauses.Topic(topic), "maintenance"))
	waitGauge(t, reg, "kafkaonce_partition_paused", 1, "the partition never showed as paused")
	require.NoError(t, c.Resume(ctx, pauses.Topic(topic)))
	waitGauge(t, reg, "kafkaonce_partition_paused", 0, "the partition still showed as paused after resume")
}

// The lag gauge counts what the consumer has yet to apply: it returns to 0
// on an idle partition whose log ends in a transaction's marker, or in the
// records of an aborted transaction, which no handler sees (a lag stuck at
// their count would fire KafkaonceStuckPartition for nothing).
func TestLagIsZeroAtTheEndOfATransactionalLog(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	producer, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.TransactionalID(testenv.Name(t, "tx")),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	t.Cleanup(producer.Close)
	ctx := context.Background()
	inTransaction := func(commit bool, ids ...string) {
		require.NoError(t, producer.BeginTransaction())
		for _, id := range ids {
			require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}}).FirstErr())
		}
		require.NoError(t, producer.EndTransaction(ctx, kgo.TransactionEndTry(commit)))
	}
	inTransaction(true, "a", "b", "c")
	inTransaction(false, "x", "y", "z", "w")

	reg := prometheus.NewPedanticRegistry()
	hooks, err := promhooks.New(reg, "ledger")
	require.NoError(t, err)
	c, err := consumer.New(db.Pool, &consumer.Config{
		Name: "ledger", GroupID: testenv.Name(t, "g"), Brokers: k.Brokers, Topics: []string{topic}, Schema: db.Schema,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, OpenTransactionAfter: 300 * time.Millisecond,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }),
		Hooks:   []consumer.Hook{hooks},
	})
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	lag := func() string {
		var b strings.Builder
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "kafkaonce_partition_lag" {
				for _, m := range mf.GetMetric() {
					b.WriteString(m.String())
				}
			}
		}
		return b.String()
	}
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(counterWith(t, reg, "kafkaonce_messages_applied_total")) < 3 || !strings.Contains(lag(), "value:0") {
		require.Truef(t, time.Now().Before(deadline), "the lag did not return to 0 at the log's end: %s", lag())
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)
}

// A share group's events count by topic and kind.
func TestShareEventsMetric(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	h, err := promhooks.New(reg, "ledger")
	require.NoError(t, err)
	var _ consumer.HookShareEvent = h
	ctx := context.Background()
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareRenewalRefused, Topic: "jobs", Offset: 1, Err: errors.New("refused")})
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareRenewalRefused, Topic: "jobs", Offset: 2, Err: errors.New("refused")})
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareSettlementLost, Topic: "jobs", Offset: 3})
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareDelivered, Topic: "jobs", Offset: 4, DeliveryCount: 1})
	h.OnShareEvent(ctx, consumer.ShareEvent{Kind: consumer.ShareDelivered, Topic: "jobs", Offset: 5, DeliveryCount: 3})
	require.NoError(t, testutil.GatherAndCompare(reg, stringsReader(`
# HELP kafkaonce_share_events_total A share group's records by what befell them: delivered, renewal_refused, lock_lost, settlement_lost, provisional_written, provisional_removed (consumer.HookShareEvent).
# TYPE kafkaonce_share_events_total counter
kafkaonce_share_events_total{consumer="ledger",event="delivered",topic="jobs"} 2
kafkaonce_share_events_total{consumer="ledger",event="renewal_refused",topic="jobs"} 2
kafkaonce_share_events_total{consumer="ledger",event="settlement_lost",topic="jobs"} 1
`), "kafkaonce_share_events_total"))
	// The delivery counts: one first delivery, one third.
	require.NoError(t, testutil.GatherAndCompare(reg, stringsReader(`
# HELP kafkaonce_share_delivery_count The delivery counts of the records a share group member is handed (1: a record's first delivery).
# TYPE kafkaonce_share_delivery_count histogram
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="1"} 1
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="2"} 1
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="3"} 2
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="4"} 2
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="5"} 2
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="6"} 2
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="7"} 2
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="8"} 2
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="9"} 2
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="10"} 2
kafkaonce_share_delivery_count_bucket{consumer="ledger",topic="jobs",le="+Inf"} 2
kafkaonce_share_delivery_count_sum{consumer="ledger",topic="jobs"} 4
kafkaonce_share_delivery_count_count{consumer="ledger",topic="jobs"} 2
`), "kafkaonce_share_delivery_count"))
}
