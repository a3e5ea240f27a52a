package otelhooks

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// Metrics: promhooks's, one for one, through the OpenTelemetry API. Where
// the semantic conventions name a metric (messaging.client.consumed.messages,
// messaging.process.duration) it has their name and attributes; the rest
// are kafkaonce.*. Three Prometheus counters of outcomes (applied, skipped,
// dead-lettered) are one consumed-messages counter here, told apart by
// kafkaonce.outcome, and the two of offset commits one counter, failures
// told by error.type. docs/metrics.md has the mapping.
type metrics struct {
	consumed, conflicts, failures, retries, suspects   metric.Int64Counter
	commits, contention, share                         metric.Int64Counter
	batchSize, deliveryCount                           metric.Int64Histogram
	txDuration, handlerDuration                        metric.Float64Histogram
	lag, stopped, held, paused, batchLimit, serialized metric.Int64Gauge
	lastCommit, nextDue                                metric.Float64Gauge
	waiting                                            metric.Int64Gauge

	base attribute.KeyValue // kafkaonce.consumer
	// sets caches the attribute sets recorded per message, by topic: most
	// calls find theirs here instead of sorting a new one.
	sets sync.Map // topic -> *topicSets
}

// topicSets are the attribute sets of one topic's per-message metrics.
type topicSets struct {
	applied, handled, handlerFailed metric.MeasurementOption
}

func (m *metrics) init(meter metric.Meter, consumerAttr attribute.KeyValue) error {
	m.base = consumerAttr
	var err error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, e := meter.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = firstErr(err, e)
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64Gauge {
		g, e := meter.Int64Gauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		err = firstErr(err, e)
		return g
	}
	m.consumed = counter("messaging.client.consumed.messages", "{message}", "Messages processed to an end: applied, skipped as duplicates, set aside in dead_letters for an operator, or set aside to be retried later (kafkaonce.outcome).")
	m.conflicts = counter("kafkaonce.messages.conflicting", "{message}", "Messages whose id was already used for different content.")
	m.failures = counter("kafkaonce.message.failures", "{failure}", "Failed attempts at messages, by class (error.type).")
	m.retries = counter("kafkaonce.message.retries", "{failure}", "Failed attempts that will be retried.")
	m.suspects = counter("kafkaonce.suspect_duplicates", "{message}", "Messages whose content was seen shortly before under another id.")
	m.commits = counter("kafkaonce.offset.commits", "{commit}", "Offset commits to Kafka; failed ones have error.type.")
	m.contention = counter("kafkaonce.contention.retries", "{transaction}", "Batch transactions that lost a race for rows (deadlock, serialization failure, lock timeout) and ran again.")
	m.share = counter("kafkaonce.share.events", "{record}", "A share group's records by what befell them (kafkaonce.share.event): delivered, renewal_refused, lock_lost, settlement_lost, provisional_written, provisional_removed.")
	var e error
	m.deliveryCount, e = meter.Int64Histogram("kafkaonce.share.delivery_count", metric.WithUnit("{delivery}"),
		metric.WithDescription("The delivery counts of the records a share group member is handed (1: a record's first delivery)."),
		metric.WithExplicitBucketBoundaries(1, 2, 3, 4, 5, 6, 7, 8, 9, 10))
	err = firstErr(err, e)
	m.batchSize, e = meter.Int64Histogram("kafkaonce.batch.size", metric.WithUnit("{message}"), metric.WithDescription("Messages per batch transaction."),
		metric.WithExplicitBucketBoundaries(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000))
	err = firstErr(err, e)
	m.txDuration, e = meter.Float64Histogram("kafkaonce.transaction.duration", metric.WithUnit("s"), metric.WithDescription("Duration of batch transactions, handlers included."),
		metric.WithExplicitBucketBoundaries(exponential(0.001, 15)...))
	err = firstErr(err, e)
	m.handlerDuration, e = meter.Float64Histogram("messaging.process.duration", metric.WithUnit("s"), metric.WithDescription("Duration of handler calls."),
		metric.WithExplicitBucketBoundaries(exponential(0.0001, 18)...))
	err = firstErr(err, e)
	m.lag = gauge("kafkaonce.partition.lag", "{message}", "Records the consumer has yet to apply: the log end it last saw minus its position, which passes transaction markers and aborted records.")
	m.stopped = gauge("kafkaonce.partition.stopped", "1", "1 while the partition is stopped at a message it cannot process.")
	m.held = gauge("kafkaonce.partition.held", "1", "1 while a producer's open transaction holds the partition back (reported after OpenTransactionAfter).")
	m.paused = gauge("kafkaonce.partition.paused", "1", "1 while a pause holds the partition: it fetches nothing until resumed.")
	m.batchLimit = gauge("kafkaonce.partition.batch_limit", "{message}", "Most messages the partition's next transaction covers: MaxBatch, or less under contention.")
	m.serialized = gauge("kafkaonce.partition.serialized", "1", "1 while the partition's transactions wait their turn at the consumer's gate because of contention.")
	m.lastCommit, e = meter.Float64Gauge("kafkaonce.partition.last_commit.timestamp", metric.WithUnit("s"), metric.WithDescription("When a batch of the partition last committed, in seconds since the Unix epoch."))
	err = firstErr(err, e)
	m.waiting = gauge("kafkaonce.retries.waiting", "{message}", "Messages set aside to be retried later whose retries are still to come; the consumer's count, the same from every member.")
	m.nextDue, e = meter.Float64Gauge("kafkaonce.retries.next_due.timestamp", metric.WithUnit("s"), metric.WithDescription("When the first message waiting to be retried is due, in seconds since the Unix epoch; 0 when none waits."))
	return firstErr(err, e)
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// exponential returns n bucket boundaries from start, each twice the last
// (promhooks's buckets).
func exponential(start float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = start
		start *= 2
	}
	return b
}

// of returns the attribute sets of a topic.
func (m *metrics) of(topic string) *topicSets {
	if s, ok := m.sets.Load(topic); ok {
		return s.(*topicSets)
	}
	t := topicKey.String(topic)
	s := &topicSets{
		applied:       metric.WithAttributeSet(attribute.NewSet(m.base, kafka, opNameKey.String("process"), t, attrOutcome.String("applied"))),
		handled:       metric.WithAttributeSet(attribute.NewSet(m.base, kafka, opNameKey.String("process"), t)),
		handlerFailed: metric.WithAttributeSet(attribute.NewSet(m.base, kafka, opNameKey.String("process"), t, errTypeKey.String("_OTHER"))),
	}
	v, _ := m.sets.LoadOrStore(topic, s)
	return v.(*topicSets)
}

func (m *metrics) with(attrs ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append(attrs, m.base)...)
}

func partitionAttrs(topic string, partition int) []attribute.KeyValue {
	return []attribute.KeyValue{topicKey.String(topic), partKey.String(strconv.Itoa(partition))}
}

// The hooks: metrics, and the events of the batch's span (see trace.go).

func (h *Hooks) OnMessageApplied(ctx context.Context, m *consumer.Message) {
	h.consumed.Add(ctx, 1, h.of(m.Topic).applied)
}

func (h *Hooks) OnMessageSkipped(ctx context.Context, m *consumer.Message, reason consumer.SkipReason) {
	h.consumed.Add(ctx, 1, h.with(kafka, opNameKey.String("process"), topicKey.String(m.Topic),
		attrOutcome.String("skipped"), attrSkipReason.String(string(reason))))
	h.skippedEvent(ctx, m, reason)
}

func (h *Hooks) OnMessageDeadLettered(ctx context.Context, m *consumer.Message, l consumer.DeadLettered) {
	outcome := "dead_lettered"
	if l.Class == deadletter.ClassRetryLater {
		outcome = "retry_later"
	}
	h.consumed.Add(ctx, 1, h.with(kafka, opNameKey.String("process"), topicKey.String(m.Topic),
		attrOutcome.String(outcome), attrClass.String(string(l.Class))))
	h.deadEvent(ctx, m, l)
}

func (h *Hooks) OnRetriesWaiting(ctx context.Context, w consumer.RetriesWaiting) {
	h.waiting.Record(ctx, w.Waiting, h.with())
	var due float64
	if !w.NextDue.IsZero() {
		due = float64(w.NextDue.UnixNano()) / 1e9
	}
	h.nextDue.Record(ctx, due, h.with())
}

func (h *Hooks) OnFingerprintConflict(ctx context.Context, err *consumer.FingerprintConflictError) {
	h.conflicts.Add(ctx, 1, h.with(topicKey.String(err.Topic)))
	h.conflictEvent(ctx, err)
}

func (h *Hooks) OnMessageFailed(ctx context.Context, m *consumer.Message, f consumer.Failure) {
	h.failures.Add(ctx, 1, h.with(topicKey.String(m.Topic), errTypeKey.String(string(f.Class)), attrPermanent.Bool(f.Permanent)))
	if !f.Permanent {
		h.retries.Add(ctx, 1, h.with(topicKey.String(m.Topic)))
	}
}

func (h *Hooks) OnSuspectDuplicate(ctx context.Context, m *consumer.Message, _ consumer.SuspectOf) {
	h.suspects.Add(ctx, 1, h.with(topicKey.String(m.Topic)))
}

// OnBatchStart shows the partition's pace: its batch size and whether its
// transactions take the gate.
func (h *Hooks) OnBatchStart(ctx context.Context, b consumer.BatchInfo) {
	p := h.with(partitionAttrs(b.Topic, b.Partition)...)
	h.batchLimit.Record(ctx, int64(b.BatchLimit), p)
	h.serialized.Record(ctx, boolInt(b.Serialized), p)
}

func (h *Hooks) OnContention(ctx context.Context, b consumer.BatchInfo, c consumer.Contention) {
	p := h.with(partitionAttrs(b.Topic, b.Partition)...)
	h.contention.Add(ctx, 1, p)
	h.batchLimit.Record(ctx, int64(c.BatchLimit), p)
	h.contentionEvent(ctx, c)
}

func (h *Hooks) OnBatchEnd(ctx context.Context, b consumer.BatchInfo, r consumer.BatchResult) {
	outcome := "committed"
	if r.Committed == 0 {
		outcome = "failed"
	}
	h.txDuration.Record(ctx, r.Duration.Seconds(), h.with(postgres, attrOutcome.String(outcome)))
	endBatchSpan(ctx, r)
	if r.Committed == 0 {
		return
	}
	h.batchSize.Record(ctx, int64(b.Size), h.with())
	p := h.with(partitionAttrs(b.Topic, b.Partition)...)
	h.lastCommit.Record(ctx, float64(time.Now().UnixNano())/1e9, p)
}

// OnShareEvent counts what befell a share group's records.
func (h *Hooks) OnShareEvent(ctx context.Context, e consumer.ShareEvent) {
	h.share.Add(ctx, 1, h.with(topicKey.String(e.Topic), attrShareEvent.String(string(e.Kind))))
	if e.Kind == consumer.ShareDelivered {
		h.deliveryCount.Record(ctx, int64(e.DeliveryCount), h.with(topicKey.String(e.Topic)))
	}
}

func (h *Hooks) OnPartitionLag(ctx context.Context, l consumer.PartitionLag) {
	h.lag.Record(ctx, l.Lag, h.with(partitionAttrs(l.Topic, l.Partition)...))
}

func (h *Hooks) OnHandlerEnd(ctx context.Context, m *consumer.Message, d time.Duration, err error) {
	s := h.of(m.Topic)
	attrs := s.handled
	if err != nil {
		attrs = s.handlerFailed
	}
	h.handlerDuration.Record(ctx, d.Seconds(), attrs)
}

func (h *Hooks) OnOffsetsCommitted(ctx context.Context, _ []consumer.TopicPartitionOffset, err error) {
	attrs := []attribute.KeyValue{kafka, settling}
	if err != nil {
		attrs = append(attrs, errTypeKey.String("_OTHER"))
	}
	h.commits.Add(ctx, 1, h.with(attrs...))
}

func (h *Hooks) OnPartitionStopped(ctx context.Context, err *consumer.PartitionError) {
	h.stopped.Record(ctx, 1, h.with(partitionAttrs(err.Topic, err.Partition)...))
}

func (h *Hooks) OnPartitionHeld(ctx context.Context, p consumer.PartitionHeld) {
	h.held.Record(ctx, boolInt(!p.Released), h.with(partitionAttrs(p.Topic, p.Partition)...))
}

func (h *Hooks) OnPartitionPaused(ctx context.Context, p consumer.PartitionPaused) {
	h.paused.Record(ctx, boolInt(!p.Resumed), h.with(partitionAttrs(p.Topic, p.Partition)...))
}

// OnPartitionAssigned clears the stopped and held flags: a new assignment
// starts again.
func (h *Hooks) OnPartitionAssigned(ctx context.Context, a consumer.PartitionAssignment) {
	p := h.with(partitionAttrs(a.Topic, a.Partition)...)
	h.stopped.Record(ctx, 0, p)
	h.held.Record(ctx, 0, p)
	h.paused.Record(ctx, 0, p)
	h.lastCommit.Record(ctx, float64(time.Now().UnixNano())/1e9, p)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
