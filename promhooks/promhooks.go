// Package promhooks exports a kafkaonce consumer's activity as Prometheus
// metrics. It is built only on the consumer's hooks, so the consumer
// package does not depend on Prometheus: import this package only if you
// want the metrics.
//
//	m, err := promhooks.New(prometheus.DefaultRegisterer, "ledger")
//	...
//	cfg.Hooks = append(cfg.Hooks, m)
//
// Metrics (all with the label consumer; per-partition ones with topic and
// partition):
//
//	kafkaonce_messages_applied_total{topic}
//	kafkaonce_messages_skipped_total{topic,reason}
//	kafkaonce_messages_conflicting_total{topic}
//	kafkaonce_messages_dead_lettered_total{topic,class}  set aside for an operator (not to be retried later)
//	kafkaonce_messages_set_aside_to_retry_total{topic}  set aside to be retried later (consumer.RetryLater)
//	kafkaonce_retries_waiting                    messages set aside to be retried later whose retries are to come
//	kafkaonce_retries_next_due_timestamp_seconds when the first of them is retried (0: none waits)
//	kafkaonce_message_failures_total{topic,class,permanent}
//	kafkaonce_message_retries_total{topic}
//	kafkaonce_suspect_duplicates_total{topic}
//	kafkaonce_batch_size                         histogram of messages per transaction
//	kafkaonce_transaction_duration_seconds{outcome}   histogram; outcome committed|failed
//	kafkaonce_handler_duration_seconds{topic}    histogram
//	kafkaonce_offset_commits_total
//	kafkaonce_offset_commit_errors_total
//	kafkaonce_partition_lag{topic,partition}     records still to apply: the log end seen minus the position
//	kafkaonce_partition_last_commit_timestamp_seconds{topic,partition}
//	kafkaonce_partition_stopped{topic,partition} 1 while a partition is stopped
//	kafkaonce_partition_held{topic,partition}    1 while a producer's open transaction holds a partition back
//	kafkaonce_partition_paused{topic,partition}  1 while a pause holds a partition (kafkaonce pause, Consumer.Pause)
//	kafkaonce_contention_retries_total{topic,partition}  transactions that lost a race for rows and ran again
//	kafkaonce_partition_batch_limit{topic,partition}     most messages the partition's next transaction covers
//	kafkaonce_partition_serialized{topic,partition}      1 while its transactions wait their turn at the consumer's gate
//	kafkaonce_share_events_total{topic,event}    a share group's deliveries, lost locks, refused renewals, lost settlements, provisional letters
//	kafkaonce_share_delivery_count{topic}        histogram of the delivery counts of the records a share member is handed
//
// NewRelay does the same for an outbox relay (outbox.RelayConfig.Hooks),
// with the label relay:
//
//	kafkaonce_outbox_delivered_total{destination}
//	kafkaonce_outbox_delivery_errors_total{destination,class,parked}
//	kafkaonce_outbox_delivery_latency_seconds{destination}  histogram, from the row's creation to its delivery
//	kafkaonce_outbox_pending                     rows to deliver, waiting ones included
//	kafkaonce_outbox_waiting                     rows waiting for a retry
//	kafkaonce_outbox_parked                      rows parked until an operator retries them
//	kafkaonce_outbox_oldest_pending_age_seconds  age of the oldest row to deliver
//
// docs/metrics.md has example alerts.
package promhooks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// Hooks records a consumer's activity in Prometheus metrics. Pass it in
// consumer.Config.Hooks.
type Hooks struct {
	applied, conflicts, retries, suspects  *prometheus.CounterVec
	skipped, dead, failures, setAside      *prometheus.CounterVec
	waiting, nextDue                       prometheus.Gauge
	batchSize                              prometheus.Observer
	txDuration                             *prometheus.HistogramVec
	handlerDuration, deliveryCount         *prometheus.HistogramVec
	commits, commitErrors                  prometheus.Counter
	lag, lastCommit, stopped, held, paused *prometheus.GaugeVec
	contention, share                      *prometheus.CounterVec
	batchLimit, serialized                 *prometheus.GaugeVec
}

// New creates the metrics for one consumer (its Config.Name) and registers
// them with reg.
func New(reg prometheus.Registerer, consumerName string) (*Hooks, error) {
	if consumerName == "" {
		return nil, errors.New("promhooks: consumerName must be the consumer's Config.Name")
	}
	labels := prometheus.Labels{"consumer": consumerName}
	counter := func(name, help string, vars ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kafkaonce", Name: name, Help: help, ConstLabels: labels}, vars)
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "kafkaonce", Name: name, Help: help, ConstLabels: labels}, []string{"topic", "partition"})
	}
	h := &Hooks{
		applied:   counter("messages_applied_total", "Messages whose effects committed.", "topic"),
		skipped:   counter("messages_skipped_total", "Messages skipped as duplicates, by reason.", "topic", "reason"),
		conflicts: counter("messages_conflicting_total", "Messages whose id was already used for different content.", "topic"),
		dead:      counter("messages_dead_lettered_total", "Messages set aside in dead_letters for an operator, by class (not those set aside to be retried later).", "topic", "class"),
		setAside:  counter("messages_set_aside_to_retry_total", "Messages set aside to be retried later by the consumer (consumer.RetryLater, Config.RetryLater).", "topic"),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kafkaonce", Name: "retries_waiting", ConstLabels: labels,
			Help: "Messages set aside to be retried later whose retries are still to come; the consumer's count, the same from every member."}),
		nextDue: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kafkaonce", Name: "retries_next_due_timestamp_seconds", ConstLabels: labels,
			Help: "When the first message waiting to be retried is due, in seconds since the Unix epoch; 0 when none waits."}),
		failures: counter("message_failures_total", "Failed attempts at messages, by class.", "topic", "class", "permanent"),
		retries:  counter("message_retries_total", "Failed attempts that will be retried.", "topic"),
		suspects: counter("suspect_duplicates_total", "Messages whose content was seen shortly before under another id.", "topic"),
		txDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kafkaonce", Name: "transaction_duration_seconds",
			Help: "Duration of batch transactions.", ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}, []string{"outcome"}),
		handlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kafkaonce", Name: "handler_duration_seconds",
			Help: "Duration of handler calls.", ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18)}, []string{"topic"}),
		lag:        gauge("partition_lag", "Records the consumer has yet to apply: the log end it last saw minus its position, which passes transaction markers and aborted records."),
		lastCommit: gauge("partition_last_commit_timestamp_seconds", "When a batch of the partition last committed."),
		stopped:    gauge("partition_stopped", "1 while the partition is stopped at a message it cannot process."),
		held:       gauge("partition_held", "1 while a producer's open transaction holds the partition back (reported after OpenTransactionAfter)."),
		paused:     gauge("partition_paused", "1 while a pause holds the partition: it fetches nothing until resumed."),
		contention: counter("contention_retries_total", "Batch transactions that lost a race for rows (deadlock, serialization failure, lock timeout) and ran again.", "topic", "partition"),
		batchLimit: gauge("partition_batch_limit", "Most messages the partition's next transaction covers: MaxBatch, or less under contention."),
		share:      counter("share_events_total", "A share group's records by what befell them: delivered, renewal_refused, lock_lost, settlement_lost, provisional_written, provisional_removed (consumer.HookShareEvent).", "topic", "event"),
		deliveryCount: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "kafkaonce", Name: "share_delivery_count",
			Help: "The delivery counts of the records a share group member is handed (1: a record's first delivery).", ConstLabels: labels,
			Buckets: prometheus.LinearBuckets(1, 1, 10)}, []string{"topic"}),
		serialized: gauge("partition_serialized", "1 while the partition's transactions wait their turn at the consumer's gate because of contention."),
	}
	batchSize := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "kafkaonce", Name: "batch_size",
		Help: "Messages per batch transaction.", ConstLabels: labels, Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}})
	commits := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kafkaonce", Name: "offset_commits_total", Help: "Offset commits to Kafka.", ConstLabels: labels})
	commitErrors := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kafkaonce", Name: "offset_commit_errors_total", Help: "Offset commits to Kafka that failed.", ConstLabels: labels})
	h.batchSize, h.commits, h.commitErrors = batchSize, commits, commitErrors
	for _, c := range []prometheus.Collector{h.applied, h.skipped, h.conflicts, h.dead, h.setAside, h.waiting, h.nextDue, h.failures, h.retries, h.suspects,
		batchSize, h.txDuration, h.handlerDuration, commits, commitErrors, h.lag, h.lastCommit, h.stopped, h.held, h.paused,
		h.contention, h.batchLimit, h.serialized, h.share, h.deliveryCount} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("promhooks: register: %w", err)
		}
	}
	return h, nil
}

var (
	_ consumer.HookMessageApplied      = (*Hooks)(nil)
	_ consumer.HookMessageSkipped      = (*Hooks)(nil)
	_ consumer.HookFingerprintConflict = (*Hooks)(nil)
	_ consumer.HookMessageDeadLettered = (*Hooks)(nil)
	_ consumer.HookMessageFailed       = (*Hooks)(nil)
	_ consumer.HookSuspectDuplicate    = (*Hooks)(nil)
	_ consumer.HookBatchEnd            = (*Hooks)(nil)
	_ consumer.HookHandlerEnd          = (*Hooks)(nil)
	_ consumer.HookOffsetsCommitted    = (*Hooks)(nil)
	_ consumer.HookPartitionStopped    = (*Hooks)(nil)
	_ consumer.HookPartitionAssigned   = (*Hooks)(nil)
	_ consumer.HookBatchStart          = (*Hooks)(nil)
	_ consumer.HookContention          = (*Hooks)(nil)
	_ consumer.HookPartitionHeld       = (*Hooks)(nil)
	_ consumer.HookPartitionPaused     = (*Hooks)(nil)
)

func (h *Hooks) OnMessageApplied(_ context.Context, m *consumer.Message) {
	h.applied.WithLabelValues(m.Topic).Inc()
}

func (h *Hooks) OnMessageSkipped(_ context.Context, m *consumer.Message, reason consumer.SkipReason) {
	h.skipped.WithLabelValues(m.Topic, string(reason)).Inc()
}

func (h *Hooks) OnFingerprintConflict(_ context.Context, err *consumer.FingerprintConflictError) {
	h.conflicts.WithLabelValues(err.Topic).Inc()
}

func (h *Hooks) OnMessageDeadLettered(_ context.Context, m *consumer.Message, l consumer.DeadLettered) {
	if l.Class == deadletter.ClassRetryLater {
		h.setAside.WithLabelValues(m.Topic).Inc()
		return
	}
	h.dead.WithLabelValues(m.Topic, string(l.Class)).Inc()
}

func (h *Hooks) OnRetriesWaiting(_ context.Context, w consumer.RetriesWaiting) {
	h.waiting.Set(float64(w.Waiting))
	if w.NextDue.IsZero() {
		h.nextDue.Set(0)
		return
	}
	h.nextDue.Set(float64(w.NextDue.UnixNano()) / 1e9)
}

func (h *Hooks) OnMessageFailed(_ context.Context, m *consumer.Message, f consumer.Failure) {
	h.failures.WithLabelValues(m.Topic, string(f.Class), strconv.FormatBool(f.Permanent)).Inc()
	if !f.Permanent {
		h.retries.WithLabelValues(m.Topic).Inc()
	}
}

func (h *Hooks) OnSuspectDuplicate(_ context.Context, m *consumer.Message, _ consumer.SuspectOf) {
	h.suspects.WithLabelValues(m.Topic).Inc()
}

// OnBatchStart shows the partition's pace: its batch size and whether its
// transactions take the gate.
func (h *Hooks) OnBatchStart(_ context.Context, b consumer.BatchInfo) {
	p := strconv.Itoa(b.Partition)
	h.batchLimit.WithLabelValues(b.Topic, p).Set(float64(b.BatchLimit))
	serialized := 0.0
	if b.Serialized {
		serialized = 1
	}
	h.serialized.WithLabelValues(b.Topic, p).Set(serialized)
}

func (h *Hooks) OnContention(_ context.Context, b consumer.BatchInfo, c consumer.Contention) {
	p := strconv.Itoa(b.Partition)
	h.contention.WithLabelValues(b.Topic, p).Inc()
	h.batchLimit.WithLabelValues(b.Topic, p).Set(float64(c.BatchLimit))
}

func (h *Hooks) OnBatchEnd(_ context.Context, b consumer.BatchInfo, r consumer.BatchResult) {
	outcome := "committed"
	if r.Committed == 0 {
		outcome = "failed"
	}
	h.txDuration.WithLabelValues(outcome).Observe(r.Duration.Seconds())
	if r.Committed == 0 {
		return
	}
	h.batchSize.Observe(float64(b.Size))
	p := strconv.Itoa(b.Partition)
	h.lastCommit.WithLabelValues(b.Topic, p).Set(float64(time.Now().UnixNano()) / 1e9)
}

// OnShareEvent counts what befell a share group's records: written minus
// removed provisional letters are records whose last delivery did not
// finish on this member.
func (h *Hooks) OnShareEvent(_ context.Context, e consumer.ShareEvent) {
	h.share.WithLabelValues(e.Topic, string(e.Kind)).Inc()
	if e.Kind == consumer.ShareDelivered {
		h.deliveryCount.WithLabelValues(e.Topic).Observe(float64(e.DeliveryCount))
	}
}

func (h *Hooks) OnPartitionLag(_ context.Context, l consumer.PartitionLag) {
	h.lag.WithLabelValues(l.Topic, strconv.Itoa(l.Partition)).Set(float64(l.Lag))
}

func (h *Hooks) OnHandlerEnd(_ context.Context, m *consumer.Message, d time.Duration, _ error) {
	h.handlerDuration.WithLabelValues(m.Topic).Observe(d.Seconds())
}

func (h *Hooks) OnOffsetsCommitted(_ context.Context, _ []consumer.TopicPartitionOffset, err error) {
	h.commits.Inc()
	if err != nil {
		h.commitErrors.Inc()
	}
}

func (h *Hooks) OnPartitionStopped(_ context.Context, err *consumer.PartitionError) {
	h.stopped.WithLabelValues(err.Topic, strconv.Itoa(err.Partition)).Set(1)
}

func (h *Hooks) OnPartitionHeld(_ context.Context, p consumer.PartitionHeld) {
	v := 1.0
	if p.Released {
		v = 0
	}
	h.held.WithLabelValues(p.Topic, strconv.Itoa(p.Partition)).Set(v)
}

func (h *Hooks) OnPartitionPaused(_ context.Context, p consumer.PartitionPaused) {
	v := 1.0
	if p.Resumed {
		v = 0
	}
	h.paused.WithLabelValues(p.Topic, strconv.Itoa(p.Partition)).Set(v)
}

// OnPartitionAssigned clears the stopped, held and paused flags: a new
// assignment starts again (and reports a pause that still holds).
func (h *Hooks) OnPartitionAssigned(_ context.Context, a consumer.PartitionAssignment) {
	h.stopped.WithLabelValues(a.Topic, strconv.Itoa(a.Partition)).Set(0)
	h.held.WithLabelValues(a.Topic, strconv.Itoa(a.Partition)).Set(0)
	h.paused.WithLabelValues(a.Topic, strconv.Itoa(a.Partition)).Set(0)
	h.lastCommit.WithLabelValues(a.Topic, strconv.Itoa(a.Partition)).Set(float64(time.Now().UnixNano()) / 1e9)
}
