package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/permanent"
	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/internal/schema"
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
)

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

	// Brokers and Dialer are used to publish to Kafka, where each row's
	// Destination is the topic, its id the message-id header.
	Brokers []string
	Dialer  *kafka.Dialer
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

	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// OnDelivered, when set, is called for every delivered row after its
	// deletion committed (for metrics such as commit-to-delivery delay).
	OnDelivered func(id string, createdAt time.Time)
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
	if c.LockBuckets < 1 || c.LockBuckets > Buckets {
		bad("LockBuckets must be between 1 and %d (got %d)", Buckets, c.LockBuckets)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r := &Relay{db: db, cfg: c, table: schema.Table(c.Schema, "outbox"), log: c.Logger.With(slog.String("component", "outbox relay")),
		budget: newBudget(c.RetryBudget, c.MinRetriesPerMinute), backoff: retry.Policy{Initial: c.RetryInitialInterval, Max: c.RetryMaxInterval}}
	if c.Deliver == nil {
		tr := &kafka.Transport{}
		if d := c.Dialer; d != nil {
			tr.TLS, tr.SASL, tr.ClientID = d.TLS, d.SASLMechanism, d.ClientID
		}
		r.writer = &kafka.Writer{Addr: kafka.TCP(c.Brokers...), Transport: tr, Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: c.BatchSize, MaxAttempts: 1}
	}
	return r, nil
}

// Run delivers rows until ctx is done, then returns nil. Several relays may
// run at once, in one process or many.
func (r *Relay) Run(ctx context.Context) error {
	defer r.Close()
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
	// due is false for a row waiting for its next attempt.
	due bool
}

// outcome of one row.
type outcome struct {
	err     error
	wait    time.Duration // for a retry
	park    bool
	deferTo time.Duration // over the retry budget: try again later, no attempt used
}

// Round runs one round: lock some key buckets with due rows, deliver up to
// BatchSize of their rows in order, and record the results. It returns how
// many rows it took.
func (r *Relay) Round(ctx context.Context) (int, error) {
	tx, err := r.db.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	buckets, err := r.lockBuckets(ctx, tx)
	if err != nil || len(buckets) == 0 {
		return 0, err
	}
	rows, err := r.take(ctx, tx, buckets)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	outcomes := make([]outcome, len(rows))
	due := r.dueRows(rows, outcomes)
	if r.writer != nil {
		r.publish(ctx, rows, due, outcomes)
	} else {
		r.deliver(ctx, rows, due, outcomes)
	}
	if r.afterDeliver != nil {
		r.afterDeliver()
	}
	if err := r.record(ctx, tx, rows, due, outcomes); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		// Delivered but not recorded: the rows are delivered again, and the
		// receivers deduplicate by id.
		return 0, fmt.Errorf("outbox: commit: %w", err)
	}
	if r.cfg.OnDelivered != nil {
		for i, ok := range due {
			if ok && outcomes[i].err == nil {
				r.cfg.OnDelivered(rows[i].id, rows[i].createdAt)
			}
		}
	}
	return len(rows), nil
}

// lockBuckets takes transaction-scoped advisory locks on some buckets with
// due rows, picked at random so several relays share the work.
func (r *Relay) lockBuckets(ctx context.Context, tx pgx.Tx) ([]int32, error) {
	sql := `SELECT DISTINCT key_bucket FROM ` + r.table + ` WHERE failed_at IS NULL AND next_attempt_at <= now()`
	args := []any{}
	if len(r.cfg.Destinations) > 0 {
		sql += ` AND destination = ANY($1)`
		args = append(args, r.cfg.Destinations)
	}
	rows, err := tx.Query(ctx, sql, args...)
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

// take reads the buckets' pending rows in order and locks them.
func (r *Relay) take(ctx context.Context, tx pgx.Tx, buckets []int32) ([]row, error) {
	sql := `SELECT seq, id, destination, message_key, message_value, headers, attempts, created_at,
	next_attempt_at <= now() FROM ` + r.table + ` WHERE key_bucket = ANY($1) AND failed_at IS NULL`
	args := []any{buckets, r.cfg.BatchSize}
	if len(r.cfg.Destinations) > 0 {
		sql += ` AND destination = ANY($3)`
		args = append(args, r.cfg.Destinations)
	}
	sql += ` ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED`
	rs, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: take rows: %w", err)
	}
	var out []row
	var rw row
	var headers []byte
	_, err = pgx.ForEachRow(rs, []any{&rw.seq, &rw.id, &rw.dest, &rw.key, &rw.val, &headers, &rw.attempts, &rw.createdAt, &rw.due}, func() error {
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

// dueRows decides which rows to attempt now: a row not due yet holds back
// the later rows of its key, to keep the key's order.
func (r *Relay) dueRows(rows []row, outcomes []outcome) []bool {
	due := make([]bool, len(rows))
	blocked := map[string]bool{}
	for i := range rows {
		k := string(rows[i].key)
		switch {
		case blocked[k]:
		case !rows[i].due:
			blocked[k] = true
		case rows[i].attempts > 0 && !r.budget.allowRetry():
			// Over the retry budget: leave it for later without using an
			// attempt.
			outcomes[i] = outcome{deferTo: r.cfg.RetryInitialInterval}
			blocked[k] = true
			due[i] = true
		default:
			due[i] = true
		}
	}
	return due
}

// publish writes the due rows to Kafka in one call. Rows of one key go to
// one partition, which Kafka accepts or rejects as a whole, in order.
func (r *Relay) publish(ctx context.Context, rows []row, due []bool, outcomes []outcome) {
	var msgs []kafka.Message
	var idx []int
	for i := range rows {
		if !due[i] || outcomes[i].deferTo > 0 {
			continue
		}
		m := kafka.Message{Topic: rows[i].dest, Key: rows[i].key, Value: rows[i].val}
		for _, h := range rows[i].headers {
			m.Headers = append(m.Headers, kafka.Header{Key: h.Key, Value: h.Value})
		}
		m.Headers = append(m.Headers, kafka.Header{Key: r.cfg.MessageIDHeader, Value: []byte(rows[i].id)})
		msgs = append(msgs, m)
		idx = append(idx, i)
	}
	if len(msgs) == 0 {
		return
	}
	err := r.writer.WriteMessages(ctx, msgs...)
	var perMessage kafka.WriteErrors
	isPer := errors.As(err, &perMessage) && len(perMessage) == len(msgs)
	for j, i := range idx {
		e := err
		if isPer {
			e = perMessage[j]
		}
		outcomes[i] = r.judge(&rows[i], e)
	}
}

// deliver hands the due rows to Deliver: keys in parallel, each key's rows
// in order.
func (r *Relay) deliver(ctx context.Context, rows []row, due []bool, outcomes []outcome) {
	byKey := map[string][]int{}
	var order []string
	for i := range rows {
		if !due[i] || outcomes[i].deferTo > 0 {
			continue
		}
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
				rw := &rows[i]
				err := r.call(ctx, &Delivery{ID: rw.id, Destination: rw.dest, Key: rw.key, Value: rw.val, Headers: rw.headers,
					Attempt: rw.attempts + 1, CreatedAt: rw.createdAt})
				outcomes[i] = r.judge(rw, err)
				if err != nil {
					// The key's later rows wait for this one.
					for _, later := range chain[n+1:] {
						outcomes[later] = outcome{deferTo: time.Millisecond}
					}
					return
				}
			}
		}(byKey[k])
	}
	wg.Wait()
}

func (r *Relay) call(ctx context.Context, d *Delivery) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("outbox: the delivery function panicked: %v", p)
		}
	}()
	return r.cfg.Deliver(ctx, d)
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
// round's transaction.
func (r *Relay) record(ctx context.Context, tx pgx.Tx, rows []row, due []bool, outcomes []outcome) error {
	var done, retrySeqs, parkSeqs []int64
	var waits []float64
	var retryErrs, parkErrs []string
	var deferSeqs []int64
	var deferWaits []float64
	for i := range rows {
		if !due[i] {
			continue
		}
		o := outcomes[i]
		switch {
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
	b := &pgx.Batch{}
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
	if b.Len() == 0 {
		return nil
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("outbox: record results: %w", err)
	}
	return nil
}
