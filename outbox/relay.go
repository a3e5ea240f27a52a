package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/cleanup"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Relay delivers outbox rows.
type Relay struct {
	db    DB
	cfg   RelayConfig
	table string
	log   *slog.Logger
	// client publishes to Kafka (nil with Deliver).
	client  kafkaclient.Client
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
	r.closeOnce.Do(func() {
		if r.client != nil {
			r.client.Close()
		}
	})
	return nil
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
	switch c.KafkaClient {
	case FranzGo:
		if c.Dialer != nil {
			bad("Dialer is kafka-go's and is used only with KafkaClient: outbox.KafkaGo; with franz-go (the default) set TLS and SASL instead")
		}
	case KafkaGo:
		if c.Dialer != nil && (c.TLS != nil || c.SASL != nil) {
			bad("Dialer and TLS or SASL are both set: set the Dialer's own TLS and SASLMechanism, or leave Dialer unset")
		}
	default:
		bad("KafkaClient must be outbox.FranzGo or outbox.KafkaGo (got %d)", c.KafkaClient)
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
		if r.client, err = r.newClient(); err != nil {
			return nil, err
		}
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
	if r.client != nil {
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
