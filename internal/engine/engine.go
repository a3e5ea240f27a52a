package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/internal/cleanup"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/pace"
	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/store/letters"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// DB is where the engine runs its transactions (see consumer.DB).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Consumer is the running engine behind a consumer.Consumer: the group
// membership, one worker per assigned partition, the offset committer,
// maintenance and the dead-letter publisher. It reaches Kafka through a
// kafkaclient.Client (see client.go).
type Consumer struct {
	*deps
	// running is set when Run is called, finished when it returns.
	running, finished atomic.Bool
}

// deps are what the engine's parts are given, the same for all of them:
// the database and the stores on it, the configuration, the user's code
// and hooks, and the state the consumer's partitions share (the gate, the
// session settings, whether the batch handler uses Tx).
type deps struct {
	// database begins the consumer's transactions (see txconn.go).
	*database
	cfg   Config
	log   *slog.Logger
	hooks Hooks
	// client is the Kafka client the workers read their partitions and
	// the group's offsets with (set by Run; nil for Redrive, which needs
	// none). The member and the dead-letter publisher are handed the
	// piece they use.
	client kafkaclient.Client
	// user is the handler and the id function, as the engine calls them.
	user     userCode
	claims   *claims.Store
	offsets  *positions.Store
	letters  *letters.Store
	attempts *attempts.Store
	// recorded is where the consumer records its settings at start-up.
	recorded *recorded.Store
	// pauses are the consumer's pauses as last read from pauseStore.
	pauses     *pauseSet
	pauseStore *pauses.Store
	// breaker pauses a topic whose messages fail too often (nil: off).
	breaker *breaker
	// health is what Health reads (see health.go).
	health *health
	// dials watches the connections of every Kafka client of the
	// consumer: it logs the failures, and Health reports the last.
	dials *kafkaclient.Dials
	retry retry.Policy
	// batchUsesTx is set once the BatchHandler used Batch.Tx during a
	// one-trip attempt: batches then always open their transaction first.
	batchUsesTx atomic.Bool
	// publish wakes the dead-letter topic publisher (nil without one).
	publish chan struct{}
	// storeID is the id of the store (schema.StoreID), read by Run before
	// any worker starts: the offsets the consumer commits name it (see
	// commitmark).
	storeID string
}

// New returns an engine for cfg, which consumer.New has validated and
// given its defaults.
func New(db DB, c Config) (*Consumer, error) {
	claims, err := claims.NewStore(c.Schema)
	if err != nil {
		return nil, err
	}
	positions, err := positions.NewStore(c.Schema)
	if err != nil {
		return nil, err
	}
	letters, err := letters.NewStore(c.Schema)
	if err != nil {
		return nil, err
	}
	tries, err := attempts.NewStore(c.Schema)
	if err != nil {
		return nil, err
	}
	settings, err := recorded.NewStore(c.Schema)
	if err != nil {
		return nil, err
	}
	paused, err := pauses.NewStore(c.Schema)
	if err != nil {
		return nil, err
	}
	out := &deps{
		database:   &database{db: db, positions: positions, gate: pace.NewGate(), gateKey: gateKey(c.Schema, c.Name)},
		cfg:        c,
		log:        c.Logger.With(slog.String("consumer", c.Name)),
		hooks:      c.HookFuncs,
		claims:     claims,
		offsets:    positions,
		letters:    letters,
		attempts:   tries,
		recorded:   settings,
		pauses:     newPauseSet(),
		health:     &health{},
		pauseStore: paused,
		breaker:    newBreaker(c.CircuitBreaker),
		retry:      retry.Policy{Initial: c.Retry.InitialInterval, Max: c.Retry.MaxInterval},
	}
	out.dials = kafkaclient.NewDials(out.log, c.TLS != nil || (c.Dialer != nil && c.Dialer.TLS != nil))
	out.user = newUserCode(&c, out.log)
	out.setSession(&c, false)
	tries.Session = func(b *pgx.Batch) { out.session().queue(b) }
	if c.DeadLetterTopic != "" {
		out.publish = make(chan struct{}, 1)
	}
	return &Consumer{deps: out}, nil
}

// Run runs the consumer until ctx ends and then drains (see
// consumer.Consumer.Run, which documents it for users).
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run was already called on this Consumer; create a new one with New")
	}
	defer c.finished.Store(true)
	if err := c.waitForSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // cancelled before it started: nothing to drain
		}
		return err
	}
	joined, stopRecording := c.recordWhenJoined(ctx)
	defer stopRecording()
	client, err := c.newClient()
	if err != nil {
		return err
	}
	defer client.Close()
	c.client = client
	c.log.Info("consumer starting", slog.String("group", c.cfg.GroupID), slog.String("group_type", c.cfg.GroupType.String()), slog.Any("topics", c.cfg.Topics), slog.String("kafka_client", c.cfg.KafkaClient.String()))
	if c.publish != nil {
		// The publisher outlives the workers' drain, so that letters written
		// while draining are published too.
		pubCtx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
		pubDone := make(chan struct{})
		go func() { defer close(pubDone); c.runPublisher(pubCtx, client) }()
		defer func() { stopPub(); <-pubDone }()
	}
	maintCtx, stopMaint := context.WithCancel(ctx)
	maintDone := make(chan struct{})
	go func() { defer close(maintDone); c.runMaintenance(maintCtx) }()
	pausesDone := make(chan struct{})
	go func() { defer close(pausesDone); c.pollPauses(maintCtx) }()
	defer func() { stopMaint(); <-maintDone; <-pausesDone }()

	if c.cfg.GroupType == kafkaoncetype.ShareGroup {
		return c.runShare(ctx, client, joined)
	}
	m := newMembership(ctx, c.deps, client, joined)
	c.health.outSince.Store(time.Now().UnixNano())
	c.health.member.Store(m)
	defer func() {
		c.health.member.Store(nil)
		c.health.inGroup.Store(false)
	}()
	commitCtx, stopCommits := context.WithCancel(context.WithoutCancel(ctx))
	commitsDone := make(chan struct{})
	go func() { defer close(commitsDone); m.committer.run(commitCtx) }()
	// RunGroup returns once every partition is revoked, which waits until
	// each worker has finished its batch and the last offsets are
	// committed, and the member has left the group.
	err = client.RunGroup(ctx, m)
	m.all.Wait()
	stopCommits()
	<-commitsDone
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	c.log.Info("consumer stopped")
	return nil
}

// CheckQueryExecMode refuses a pool whose connections send statements in
// the simple protocol by default: pgx writes the arguments into the text
// there, and cannot write the consumer's arrays, and it joins a batch's
// statements into one text, where the server would run every statement a
// handler's queued text holds. The extended protocol's modes all work,
// QueryExecModeExec behind a PgBouncer in transaction mode too.
func CheckQueryExecMode(mode pgx.QueryExecMode) error {
	if mode == pgx.QueryExecModeSimpleProtocol {
		return errors.New("consumer: the pool's DefaultQueryExecMode is QueryExecModeSimpleProtocol, which sends a batch's statements as one text and cannot send the consumer's arrays: use the default, or pgx.QueryExecModeExec behind a PgBouncer in transaction mode")
	}
	return nil
}

// waitForSchema checks the schema, waiting (with backoff, until ctx ends)
// while Postgres cannot be reached: a worker that starts before its database
// should wait for it, not exit. A schema that is missing or newer is an error
// at once.
func (c *Consumer) waitForSchema(ctx context.Context) error {
	backoff := c.retry.New()
	for {
		err := c.checkSchema(ctx)
		if err == nil || !isInfraError(err) {
			return err
		}
		c.log.Warn("waiting for Postgres", slog.String("error", err.Error()))
		if err := retry.Sleep(ctx, backoff.Next()); err != nil {
			return err
		}
	}
}

func (c *Consumer) checkSchema(ctx context.Context) error {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("consumer: connect to Postgres: %w", err)
	}
	defer func() { _ = cleanup.Rollback(ctx, tx) }()
	if err := CheckQueryExecMode(tx.Conn().Config().DefaultQueryExecMode); err != nil {
		return err
	}
	if err := c.applySession(ctx, tx); err != nil {
		return fmt.Errorf("consumer: connect to Postgres: %w", err)
	}
	if err := schema.RequireLatest(ctx, tx, c.cfg.Schema); err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	// The check every batch makes once its handlers are done, made on
	// the pool's session as it comes: a pool whose sessions start unfit
	// (a search_path with a schema before pg_catalog, a replica
	// session_replication_role) would fail every batch, and set every
	// message aside, for what no handler did.
	if _, err := tx.Exec(ctx, schema.AfterUserCode(c.cfg.Schema)); err != nil {
		return fmt.Errorf("consumer: the pool's sessions, before any handler ran, are not as the consumer's statements need them: fix the pool's settings (its connection string, the role's or the database's defaults): %w", err)
	}
	if c.storeID, err = schema.StoreID(ctx, tx, c.cfg.Schema); err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	// Numbered now and committed below, so that the partitions' first
	// claims only look the number up instead of all waiting for the one
	// that numbers a new name.
	if _, err := c.claims.NumberConsumer(ctx, tx, c.cfg.Name); err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	var version int
	if err := tx.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		return fmt.Errorf("consumer: read the server version: %w", err)
	}
	if version >= 140000 {
		c.setSession(&c.cfg, true)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("consumer: number the consumer name: %w", err)
	}
	return nil
}

// wakePublisher tells the dead-letter topic publisher that letters were
// written.
func (c *deps) wakePublisher() {
	if c.publish == nil {
		return
	}
	select {
	case c.publish <- struct{}{}:
	default:
	}
}
