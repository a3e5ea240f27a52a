package outbox

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/cleanup"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/kafkago"
	"github.com/kafkaonce/kafkaonce/internal/permanent"
	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
)

// Defaults of RelayConfig.
const (
	DefaultBatchSize            = 500
	DefaultPollInterval         = 50 * time.Millisecond
	DefaultMaxAttempts          = 10
	DefaultRetryInitialInterval = time.Second
	DefaultRetryMaxInterval     = 5 * time.Minute
	DefaultRetryBudget          = 0.1
	DefaultMinRetriesPerMinute  = 10
	DefaultConcurrency          = 8
	DefaultLockBuckets          = 16
	DefaultDeliveryTimeout      = 30 * time.Second
)

// deliveryGrace is how long a call past DeliveryTimeout, its context
// cancelled, may take to return before it is abandoned.
const deliveryGrace = 2 * time.Second

// maxBatchBytes bounds the bytes of one write to Kafka: kafka-go's default
// BatchBytes, under the broker's default message.max.bytes (1048588). A
// message larger than this is never sent.
const maxBatchBytes = 1 << 20

// DeliverFunc delivers one message to a receiver other than Kafka, typically
// an HTTP API, using d.ID as the idempotency key. Return nil once the
// receiver has it; Permanent(err) when it rejected the message for good;
// RetryAfter(err, d) when it asked to wait; any other error to retry with
// backoff. HTTPResult does this classification for HTTP responses.
type DeliverFunc func(ctx context.Context, d *Delivery) error

// Delivery is one attempt at delivering a message.
type Delivery struct {
	ID          string
	Destination string
	Key, Value  []byte
	Headers     []Header
	// Attempt counts from 1.
	Attempt   int
	CreatedAt time.Time
}

// RelayConfig configures a Relay. Zero fields take the defaults named.
type RelayConfig struct {
	// Schema holds the outbox table. Defaults to "kafkaonce".
	Schema string

	// Brokers are where the relay publishes to Kafka: each row's
	// Destination is the topic, its id the message-id header.
	Brokers []string
	// TLS and SASL secure the connections to the brokers, as in
	// consumer.Config (see docs/security.md). Default: plaintext, no
	// authentication.
	TLS  *tls.Config
	SASL *kafkaconn.SASL
	// Dialer, instead of TLS and SASL, is a kafka-go dialer whose TLS and
	// SASL settings the relay uses: the relay publishes with kafka-go (see
	// docs/design.md, "The outbox").
	Dialer *kafka.Dialer
	// MessageIDHeader names the header carrying the row id. Defaults to
	// "message-id", the header kafkaonce consumers read by default.
	MessageIDHeader string

	// Deliver, when set, receives every row instead of Kafka.
	Deliver DeliverFunc

	// Destinations limits the relay to these destinations. Defaults to all.
	Destinations []string

	// BatchSize bounds the rows one round takes. Defaults to
	// DefaultBatchSize.
	BatchSize int
	// PollInterval is the pause after a round that found less than a full
	// batch. Defaults to DefaultPollInterval.
	PollInterval time.Duration

	// MaxAttempts bounds the attempts at one row; then it is parked.
	// Defaults to DefaultMaxAttempts.
	MaxAttempts int
	// Retries wait random(0, min(RetryMaxInterval, RetryInitialInterval·2^n)),
	// or longer when the receiver said Retry-After. Defaults:
	// DefaultRetryInitialInterval, DefaultRetryMaxInterval.
	RetryInitialInterval time.Duration
	RetryMaxInterval     time.Duration
	// RetryBudget and MinRetriesPerMinute cap retries per minute at
	// MinRetriesPerMinute + RetryBudget × successful deliveries, so a
	// receiver that is down gets a trickle of retries, not a flood. Retries
	// over the budget wait, without using up an attempt. Defaults:
	// DefaultRetryBudget, DefaultMinRetriesPerMinute.
	RetryBudget         float64
	MinRetriesPerMinute int

	// Concurrency bounds parallel Deliver calls (different keys). Defaults to
	// DefaultConcurrency.
	Concurrency int
	// LockBuckets is how many key buckets (of Buckets) one round may take;
	// other relays take the rest. Defaults to DefaultLockBuckets.
	LockBuckets int

	// DeliveryTimeout bounds one Deliver call, and one write to Kafka. The
	// round's transaction, and the locks on its buckets, stay open until
	// its deliveries return, so a hung receiver must not hold them: when
	// DeliveryTimeout passes, the call's context is cancelled; a Deliver
	// that still has not returned 2 seconds later is abandoned with its
	// goroutine. The attempt counts as a failure and is retried with
	// backoff; the round records its results and commits, which frees its
	// buckets. An abandoned call may still reach the receiver, which
	// deduplicates by id. Defaults to DefaultDeliveryTimeout.
	DeliveryTimeout time.Duration

	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnDelivered, when set, is called for every delivered row after its
	// deletion committed (for metrics such as commit-to-delivery delay).
	// HookDelivered reports the same, with the destination and attempts.
	OnDelivered func(id string, createdAt time.Time)

	// Hooks observe the relay: deliveries, failed attempts and the
	// backlog (see Hook; promhooks.NewRelay and otelhooks.NewRelay turn
	// them into metrics).
	Hooks []Hook
	// BacklogInterval is how often Run counts the backlog for
	// HookBacklog; the counts run only when a hook implements it.
	// Defaults to DefaultBacklogInterval.
	BacklogInterval time.Duration
}

// Relay delivers outbox rows.
type Relay struct {
	db      DB
	cfg     RelayConfig
	table   string
	log     *slog.Logger
	writer  *kafka.Writer
	budget  *budget
	backoff retry.Policy
	hooks   relayHooks
	// afterDeliver runs between delivering and committing (tests: a crash
	// there).
	afterDeliver func()
	closeOnce    sync.Once
}

// Close releases the relay's Kafka connections. Run closes them when it
// returns; call Close after using Round directly.
func (r *Relay) Close() error {
	var err error
	r.closeOnce.Do(func() {
		if r.writer != nil {
			err = r.writer.Close()
		}
	})
	return err
}

// NewRelay validates cfg and returns a Relay.
func NewRelay(db DB, cfg *RelayConfig) (*Relay, error) {
	if db == nil || cfg == nil {
		return nil, errors.New("outbox: NewRelay needs a database and a config")
	}
	c := *cfg
	if c.Schema == "" {
		c.Schema = schema.DefaultName
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BatchSize, DefaultBatchSize)
	def(&c.MaxAttempts, DefaultMaxAttempts)
	def(&c.MinRetriesPerMinute, DefaultMinRetriesPerMinute)
	def(&c.Concurrency, DefaultConcurrency)
	def(&c.LockBuckets, DefaultLockBuckets)
	defD(&c.PollInterval, DefaultPollInterval)
	defD(&c.RetryInitialInterval, DefaultRetryInitialInterval)
	defD(&c.RetryMaxInterval, DefaultRetryMaxInterval)
	defD(&c.DeliveryTimeout, DefaultDeliveryTimeout)
	defD(&c.BacklogInterval, DefaultBacklogInterval)
	if c.RetryBudget == 0 {
		c.RetryBudget = DefaultRetryBudget
	}
	if c.MessageIDHeader == "" {
		c.MessageIDHeader = "message-id"
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf("outbox: "+format, args...)) }
	if err := schema.ValidateName(c.Schema); err != nil {
		bad("Schema %v", err)
	}
	if c.Deliver == nil && len(c.Brokers) == 0 {
		bad("set Brokers to publish to Kafka, or Deliver to hand rows to a function")
	}
	if c.Dialer != nil && (c.TLS != nil || c.SASL != nil) {
		bad("Dialer and TLS or SASL are both set: set the Dialer's own TLS and SASLMechanism, or leave Dialer unset")
	}
	if err := c.SASL.CheckOver(c.TLS); err != nil {
		bad("%v", err)
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		bad("BatchSize must be between 1 and 10000 (got %d)", c.BatchSize)
	}
	if c.MaxAttempts < 1 {
		bad("MaxAttempts must be at least 1 (got %d)", c.MaxAttempts)
	}
	if c.RetryInitialInterval <= 0 || c.RetryMaxInterval < c.RetryInitialInterval {
		bad("RetryInitialInterval must be positive and at most RetryMaxInterval (got %v and %v)", c.RetryInitialInterval, c.RetryMaxInterval)
	}
	if c.RetryBudget < 0 || c.MinRetriesPerMinute < 0 {
		bad("RetryBudget and MinRetriesPerMinute must not be negative")
	}
	if c.DeliveryTimeout < 0 {
		bad("DeliveryTimeout must be positive, or zero for DefaultDeliveryTimeout (got %v)", c.DeliveryTimeout)
	}
	if c.LockBuckets < 1 || c.LockBuckets > Buckets {
		bad("LockBuckets must be between 1 and %d (got %d)", Buckets, c.LockBuckets)
	}
	if c.BacklogInterval < 0 {
		bad("BacklogInterval must be positive, or zero for DefaultBacklogInterval (got %v)", c.BacklogInterval)
	}
	hooks, err := sortHooks(c.Hooks)
	if err != nil {
		bad("%v", err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r := &Relay{db: db, cfg: c, table: schema.Table(c.Schema, "outbox"), log: c.Logger.With(slog.String("component", "outbox relay")),
		budget: newBudget(c.RetryBudget, c.MinRetriesPerMinute), backoff: retry.Policy{Initial: c.RetryInitialInterval, Max: c.RetryMaxInterval}, hooks: hooks}
	if c.Deliver == nil {
		mech, err := kafkaclient.Mechanism(c.SASL)
		if err != nil {
			return nil, fmt.Errorf("outbox: %w", err)
		}
		dials := kafkaclient.NewDials(r.log, c.TLS != nil || (c.Dialer != nil && c.Dialer.TLS != nil))
		_, tr := kafkago.Connection(kafkaclient.Config{TLS: c.TLS, SASL: mech, ClientID: "kafkaonce-relay", Dials: dials}, c.Dialer)
		r.writer = &kafka.Writer{Addr: kafka.TCP(c.Brokers...), Transport: tr, Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: c.BatchSize, BatchBytes: maxBatchBytes, MaxAttempts: 1}
	}
	return r, nil
}

// Run delivers rows until ctx is done, then returns nil. Several relays may
// run at once, in one process or many.
func (r *Relay) Run(ctx context.Context) error {
	defer r.Close()
	if len(r.hooks.backlog) > 0 {
		var wg sync.WaitGroup
		wg.Go(func() { r.reportBacklog(ctx) })
		defer wg.Wait()
	}
	backoff := retry.Policy{Initial: 100 * time.Millisecond, Max: 5 * time.Second}.New()
	for ctx.Err() == nil {
		n, err := r.Round(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			r.log.Warn("outbox round failed; retrying", slog.String("error", err.Error()))
			_ = retry.Sleep(ctx, backoff.Next())
			continue
		}
		backoff.Reset()
		if n < r.cfg.BatchSize {
			_ = retry.Sleep(ctx, r.cfg.PollInterval)
		}
	}
	return nil
}

type row struct {
	seq       int64
	id, dest  string
	key, val  []byte
	headers   []Header
	attempts  int
	createdAt time.Time
}

// outcome of one row.
type outcome struct {
	err     error
	wait    time.Duration // for a retry
	park    bool
	deferTo time.Duration // over the retry budget: try again later, no attempt used
	// held means not attempted, because an earlier row of its key failed in this
	// round. Nothing is recorded: the failed row, waiting, holds it back.
	held bool
}

// delivered reports whether the row reached its receiver.
func (o *outcome) delivered() bool { return o.err == nil && o.deferTo == 0 && !o.held }

// Round runs one round: lock some key buckets with rows to deliver, deliver
// up to BatchSize of their rows in order, and record the results. It
// returns how many rows it took.
func (r *Relay) Round(ctx context.Context) (int, error) {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = cleanup.Rollback(ctx, tx) }()

	buckets, err := r.lockBuckets(ctx, tx)
	if err != nil || len(buckets) == 0 {
		return 0, err
	}
	rows, err := r.take(ctx, tx, buckets)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	outcomes := make([]outcome, len(rows))
	r.spendBudget(rows, outcomes)
	if r.writer != nil {
		r.publish(ctx, rows, outcomes)
	} else {
		r.deliver(ctx, rows, outcomes)
	}
	if r.afterDeliver != nil {
		r.afterDeliver()
	}
	now, err := r.record(ctx, tx, rows, outcomes)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		// Delivered but not recorded: the rows are delivered again, and the
		// receivers deduplicate by id.
		return 0, fmt.Errorf("outbox: commit: %w", err)
	}
	if r.cfg.OnDelivered != nil {
		for i := range rows {
			if outcomes[i].delivered() {
				r.cfg.OnDelivered(rows[i].id, rows[i].createdAt)
			}
		}
	}
	r.report(ctx, rows, outcomes, now)
	return len(rows), nil
}

// ready is the condition on a row of outbox o that the relay may attempt
// now: due, and its key not waiting for a retry. A key is its message_key
// (a NULL key and an empty one are the same key, as they are to the Go
// side, and share bucket 0), within the relay's destinations. While one of
// its rows waits, none of the key's other rows goes: not those behind it,
// nor one that sorts before it but committed after it was first attempted
// (a transaction that was still open then), so nothing reaches the
// receiver ahead of the row it already saw first. The waiting rows are few
// (those that failed and are not parked) and read through
// outbox_waiting_idx. $1 is the relay's destinations, or NULL for all.
const ready = `o.failed_at IS NULL AND o.next_attempt_at <= now() AND ($1::text[] IS NULL OR o.destination = ANY($1))
	AND NOT EXISTS (SELECT 1 FROM waiting w WHERE w.k = coalesce(o.message_key, ''))`

// waiting is the CTE of the keys with a waiting row in the buckets the
// condition bucketCond (on w) allows.
func (r *Relay) waiting(bucketCond string) string {
	return `WITH waiting AS MATERIALIZED (SELECT DISTINCT coalesce(w.message_key, '') AS k FROM ` + r.table + ` w
	WHERE ` + bucketCond + ` AND w.failed_at IS NULL AND w.next_attempt_at > '-infinity' AND w.next_attempt_at > now()
	AND ($1::text[] IS NULL OR w.destination = ANY($1))) `
}

func (r *Relay) destinations() []string {
	if len(r.cfg.Destinations) == 0 {
		return nil
	}
	return r.cfg.Destinations
}

// lockBuckets takes transaction-scoped advisory locks on some buckets with
// rows ready, picked at random so several relays share the work. A bucket
// whose only rows wait, or are held back by a waiting row, is not picked:
// with nothing ready the relay sleeps.
func (r *Relay) lockBuckets(ctx context.Context, tx pgx.Tx) ([]int32, error) {
	// One ordered probe of outbox_pending_idx per bucket, stopping at the
	// bucket's first ready row: the cost is the buckets, and the held-back
	// rows ahead of that row, not the backlog.
	sql := r.waiting(`true`) + `SELECT b FROM generate_series(0, ` + fmt.Sprint(Buckets-1) + `) b
	CROSS JOIN LATERAL (SELECT 1 FROM ` + r.table + ` o WHERE o.key_bucket = b AND ` + ready + ` ORDER BY o.seq LIMIT 1) first`
	rows, err := tx.Query(ctx, sql, r.destinations())
	if err != nil {
		return nil, fmt.Errorf("outbox: find work: %w", err)
	}
	candidates, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, fmt.Errorf("outbox: find work: %w", err)
	}
	rand.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })
	candidates = candidates[:min(len(candidates), r.cfg.LockBuckets)]
	if len(candidates) == 0 {
		return nil, nil
	}
	var locked []int32
	err = tx.QueryRow(ctx, `SELECT coalesce(array_agg(b), '{}') FROM unnest($1::int[]) b WHERE pg_try_advisory_xact_lock(hashtext($2), b)`,
		candidates, "kafkaonce.outbox:"+r.table).Scan(&locked)
	if err != nil {
		return nil, fmt.Errorf("outbox: lock buckets: %w", err)
	}
	return locked, nil
}

// take reads the buckets' ready rows in order and locks them. Rows held back
// by a waiting row of their key are not read, so they cannot fill the batch
// and keep the bucket's other keys out.
func (r *Relay) take(ctx context.Context, tx pgx.Tx, buckets []int32) ([]row, error) {
	sql := r.waiting(`w.key_bucket = ANY($2)`) + `SELECT o.seq, o.id, o.destination, o.message_key, o.message_value, o.headers, o.attempts, o.created_at
	FROM ` + r.table + ` o WHERE o.key_bucket = ANY($2) AND ` + ready + `
	ORDER BY o.seq LIMIT $3 FOR UPDATE OF o SKIP LOCKED`
	rs, err := tx.Query(ctx, sql, r.destinations(), buckets, r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("outbox: take rows: %w", err)
	}
	var out []row
	var rw row
	var headers []byte
	_, err = pgx.ForEachRow(rs, []any{&rw.seq, &rw.id, &rw.dest, &rw.key, &rw.val, &headers, &rw.attempts, &rw.createdAt}, func() error {
		rw.headers = nil
		if err := json.Unmarshal(headers, &rw.headers); err != nil {
			return fmt.Errorf("outbox: headers of row %s: %w", rw.id, err)
		}
		out = append(out, rw)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: take rows: %w", err)
	}
	return out, nil
}

// spendBudget defers the retries over the retry budget, without using an
// attempt; a deferred row holds the later rows of its key.
func (r *Relay) spendBudget(rows []row, outcomes []outcome) {
	blocked := map[string]bool{}
	for i := range rows {
		k := string(rows[i].key)
		switch {
		case blocked[k]:
			outcomes[i] = outcome{held: true}
		case rows[i].attempts > 0 && !r.budget.allowRetry():
			outcomes[i] = outcome{deferTo: r.cfg.RetryInitialInterval}
			blocked[k] = true
		}
	}
}

// pending reports whether the row is still to be attempted this round.
func (o *outcome) pending() bool { return o.deferTo == 0 && !o.held }

// publish writes the rows to Kafka, in calls made one after the other in
// the rows' order, and keeps each key's order by construction:
//
//   - kafka-go splits a call's messages into one batch per partition,
//     unless they pass BatchBytes; each call holds at most BatchBytes, so
//     a key's messages in a call are one batch, which the broker appends or
//     rejects as a whole;
//   - a key's messages in one call go to one topic (a key that has a row
//     for another topic starts a new call);
//   - once a row of a key failed, the key's later rows are held: not
//     sent in this round, and then held back by the waiting row.
//
// A message larger than BatchBytes never goes (kafka-go rejects the whole
// call), and one the broker rejects as too large alone never will: both
// are parked at once with the reason. (A message without a key goes to any
// partition, so such messages have no order in Kafka.)
func (r *Relay) publish(ctx context.Context, rows []row, outcomes []outcome) {
	failed := map[string]bool{}
	var idx []int
	var msgs []kafka.Message
	var bytes int64
	topicOf := map[string]string{} // key -> topic, in the current call
	flush := func() {
		if len(msgs) > 0 {
			r.write(ctx, rows, outcomes, idx, msgs, failed)
		}
		idx, msgs, bytes = idx[:0], msgs[:0], 0
		clear(topicOf)
	}
	for i := range rows {
		rw := &rows[i]
		k := string(rw.key)
		if failed[k] {
			outcomes[i] = outcome{held: true}
			continue
		}
		if !outcomes[i].pending() {
			continue
		}
		m := kafka.Message{Topic: rw.dest, Key: rw.key, Value: rw.val}
		for _, h := range rw.headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		m.Headers = append(m.Headers, kafka.Header{Key: r.cfg.MessageIDHeader, Value: []byte(rw.id)})
		size := messageBytes(&m)
		if size > maxBatchBytes {
			// Earlier rows of the key in the current call go first; this one
			// can never go.
			flush()
			if failed[k] {
				outcomes[i] = outcome{held: true}
				continue
			}
			outcomes[i] = outcome{park: true, err: withClass(FailureTooLarge, fmt.Errorf("outbox: message of %d bytes is larger than the %d bytes the relay sends to Kafka in one request; it can never be published: make it smaller",
				size, maxBatchBytes))}
			failed[k] = true
			continue
		}
		if t, ok := topicOf[k]; (ok && t != rw.dest) || bytes+size > maxBatchBytes {
			flush()
			if failed[k] {
				outcomes[i] = outcome{held: true}
				continue
			}
		}
		topicOf[k] = rw.dest
		idx, msgs, bytes = append(idx, i), append(msgs, m), bytes+size
	}
	flush()
}

// write makes one WriteMessages call and judges its rows; failed collects
// the keys of rows that failed. The messages the broker rejected as too
// large in a batch of several are sent again one at a time, in order, to
// learn which one can never fit: none of them was appended.
func (r *Relay) write(ctx context.Context, rows []row, outcomes []outcome, idx []int, msgs []kafka.Message, failed map[string]bool) {
	wctx, cancel := context.WithTimeout(ctx, r.cfg.DeliveryTimeout)
	err := r.writer.WriteMessages(wctx, msgs...)
	if err != nil && wctx.Err() != nil && ctx.Err() == nil {
		err = withClass(FailureTimeout, fmt.Errorf("outbox: the write to Kafka exceeded DeliveryTimeout (%v): %w", r.cfg.DeliveryTimeout, err))
	}
	timedOut := wctx.Err() != nil
	cancel()
	var perMessage kafka.WriteErrors
	isPer := errors.As(err, &perMessage) && len(perMessage) == len(msgs)
	if err != nil && !isPer && !timedOut && ctx.Err() == nil && r.splitByTopic(ctx, rows, outcomes, idx, msgs, failed) {
		return
	}
	var alone []int // positions in msgs
	for j, i := range idx {
		e := err
		if isPer {
			e = perMessage[j]
		}
		if tooLarge(e) && len(msgs) > 1 {
			alone = append(alone, j)
			continue
		}
		r.judgeKafka(&rows[i], &outcomes[i], e, failed)
	}
	for _, j := range alone {
		i := idx[j]
		if failed[string(rows[i].key)] {
			outcomes[i] = outcome{held: true}
			continue
		}
		r.write(ctx, rows, outcomes, []int{i}, msgs[j:j+1], failed)
	}
}

// splitByTopic sends a call that failed as a whole again one topic at a
// time, and says whether it did: kafka-go fails a whole call when it cannot
// look up one of its topics (one that does not exist, say), and that error
// is no other topic's. A key's messages in a call are of one topic, so
// each key's order holds.
func (r *Relay) splitByTopic(ctx context.Context, rows []row, outcomes []outcome, idx []int, msgs []kafka.Message, failed map[string]bool) bool {
	var topics []string
	byTopic := map[string][]int{} // positions in msgs
	for j := range msgs {
		t := msgs[j].Topic
		if _, ok := byTopic[t]; !ok {
			topics = append(topics, t)
		}
		byTopic[t] = append(byTopic[t], j)
	}
	if len(topics) < 2 {
		return false
	}
	for _, t := range topics {
		var sub []int
		var subMsgs []kafka.Message
		for _, j := range byTopic[t] {
			sub, subMsgs = append(sub, idx[j]), append(subMsgs, msgs[j])
		}
		r.write(ctx, rows, outcomes, sub, subMsgs, failed)
	}
	return true
}

// judgeKafka records the result of one message's write.
func (r *Relay) judgeKafka(rw *row, o *outcome, err error, failed map[string]bool) {
	if tooLarge(err) {
		// Sent alone: it can never fit.
		err = withClass(FailureTooLarge, permanent.Mark(fmt.Errorf("outbox: the broker rejects the message as larger than the topic's max.message.bytes (or its segment.bytes); it can never be published: make it smaller, or raise the topic's limit and retry the row: %w", err)))
	}
	*o = r.judge(rw, err)
	if err != nil {
		failed[string(rw.key)] = true
	}
}

// tooLarge reports whether the broker refused a write for its size: a
// batch larger than the topic's max.message.bytes, or than its
// segment.bytes (which no retry mends either).
func tooLarge(err error) bool {
	return err != nil && (errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.RecordListTooLarge))
}

// messageBytes is the size kafka-go counts a message as against BatchBytes
// (kafka.Message's unexported totalSize).
func messageBytes(m *kafka.Message) int64 {
	n := int64(4 + 1 + 1 + 4 + len(m.Key) + 4 + len(m.Value) + 8)
	n += int64(varIntLen(len(m.Headers)))
	for _, h := range m.Headers {
		n += int64(varIntLen(len(h.Key)) + len(h.Key) + varIntLen(len(h.Value)) + len(h.Value))
	}
	return n
}

func varIntLen(i int) int {
	u := uint64(int64(i)<<1) ^ uint64(int64(i)>>63) // zig-zag
	n := 1
	for ; u >= 0x80; u >>= 7 {
		n++
	}
	return n
}

// deliver hands the rows to Deliver: keys in parallel, each key's rows in
// order; once a row of a key failed, the key's later rows are held.
func (r *Relay) deliver(ctx context.Context, rows []row, outcomes []outcome) {
	byKey := map[string][]int{}
	var order []string
	for i := range rows {
		k := string(rows[i].key)
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], i)
	}
	sem := make(chan struct{}, r.cfg.Concurrency)
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func(chain []int) {
			defer wg.Done()
			defer func() { <-sem }()
			for n, i := range chain {
				if !outcomes[i].pending() {
					continue
				}
				rw := &rows[i]
				err := r.call(ctx, &Delivery{ID: rw.id, Destination: rw.dest, Key: rw.key, Value: rw.val, Headers: rw.headers,
					Attempt: rw.attempts + 1, CreatedAt: rw.createdAt})
				outcomes[i] = r.judge(rw, err)
				if err != nil {
					for _, later := range chain[n+1:] {
						if outcomes[later].pending() {
							outcomes[later] = outcome{held: true}
						}
					}
					return
				}
			}
		}(byKey[k])
	}
	wg.Wait()
}

// call runs Deliver under DeliveryTimeout, in a goroutine of its own so that
// a call that ignores its context can be abandoned.
func (r *Relay) call(ctx context.Context, d *Delivery) error {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.DeliveryTimeout)
	defer cancel()
	done := make(chan error, 1) // buffered: an abandoned call still returns
	go func() {
		defer func() {
			if p := recover(); p != nil {
				done <- withClass(FailurePanic, fmt.Errorf("outbox: the delivery function panicked: %v", p))
			}
		}()
		done <- r.cfg.Deliver(cctx, d)
	}()
	timedOut := func(err error) error {
		if err != nil && cctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
			return withClass(FailureTimeout, fmt.Errorf("outbox: Deliver exceeded DeliveryTimeout (%v): %w", r.cfg.DeliveryTimeout, err))
		}
		return err
	}
	select {
	case err := <-done:
		return timedOut(err)
	case <-cctx.Done():
	}
	grace := time.NewTimer(deliveryGrace)
	defer grace.Stop()
	select {
	case err := <-done:
		return timedOut(err)
	case <-grace.C:
		return withClass(FailureTimeout, fmt.Errorf("outbox: Deliver did not return within DeliveryTimeout (%v) and %v after its context was cancelled; it was abandoned, and the row is retried",
			r.cfg.DeliveryTimeout, deliveryGrace))
	}
}

// judge turns a delivery's error into what to record.
func (r *Relay) judge(rw *row, err error) outcome {
	if err == nil {
		r.budget.success()
		return outcome{}
	}
	attempt := rw.attempts + 1
	if permanent.Is(err) || attempt >= r.cfg.MaxAttempts {
		return outcome{err: err, park: true}
	}
	wait := r.backoff.Wait(attempt)
	var ra *retryAfterError
	if errors.As(err, &ra) {
		wait = max(wait, ra.after)
	}
	return outcome{err: err, wait: wait}
}

// record deletes delivered rows and schedules or parks the others, in the
// round's transaction, and returns the database's clock then: what a
// delivery's latency is measured to, by the clock of the rows' created_at.
func (r *Relay) record(ctx context.Context, tx pgx.Tx, rows []row, outcomes []outcome) (time.Time, error) {
	var done, retrySeqs, parkSeqs []int64
	var waits []float64
	var retryErrs, parkErrs []string
	var deferSeqs []int64
	var deferWaits []float64
	for i := range rows {
		o := outcomes[i]
		switch {
		case o.held:
		case o.deferTo > 0:
			deferSeqs = append(deferSeqs, rows[i].seq)
			deferWaits = append(deferWaits, o.deferTo.Seconds())
		case o.err == nil:
			done = append(done, rows[i].seq)
		case o.park:
			parkSeqs = append(parkSeqs, rows[i].seq)
			parkErrs = append(parkErrs, o.err.Error())
			r.log.Error("outbox row parked: it will not be retried until an operator retries it", slog.String("id", rows[i].id),
				slog.String("destination", rows[i].dest), slog.Int("attempts", rows[i].attempts+1), slog.String("error", o.err.Error()))
		default:
			retrySeqs = append(retrySeqs, rows[i].seq)
			waits = append(waits, o.wait.Seconds())
			retryErrs = append(retryErrs, o.err.Error())
		}
	}
	// The clock goes first, in the same round trip.
	b := &pgx.Batch{}
	b.Queue(`SELECT clock_timestamp()`)
	if len(done) > 0 {
		b.Queue(`DELETE FROM `+r.table+` WHERE seq = ANY($1)`, done)
	}
	if len(retrySeqs) > 0 {
		b.Queue(`UPDATE `+r.table+` o SET attempts = o.attempts + 1, last_error = u.err,
	next_attempt_at = now() + make_interval(secs => u.wait)
FROM unnest($1::bigint[], $2::float8[], $3::text[]) AS u(seq, wait, err) WHERE o.seq = u.seq`, retrySeqs, waits, retryErrs)
	}
	if len(parkSeqs) > 0 {
		b.Queue(`UPDATE `+r.table+` o SET attempts = o.attempts + 1, last_error = u.err, failed_at = now()
FROM unnest($1::bigint[], $2::text[]) AS u(seq, err) WHERE o.seq = u.seq`, parkSeqs, parkErrs)
	}
	if len(deferSeqs) > 0 {
		b.Queue(`UPDATE `+r.table+` o SET next_attempt_at = greatest(o.next_attempt_at, now() + make_interval(secs => u.wait))
FROM unnest($1::bigint[], $2::float8[]) AS u(seq, wait) WHERE o.seq = u.seq`, deferSeqs, deferWaits)
	}
	br := tx.SendBatch(ctx, b)
	var now time.Time
	err := br.QueryRow().Scan(&now)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("outbox: record results: %w", err)
	}
	return now, nil
}
