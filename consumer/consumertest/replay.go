package consumertest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// ReplayOptions adjusts ReplayTwice.
type ReplayOptions struct {
	// KeepPositions keeps the stored positions for the second run, so the
	// replay is skipped by position, as a plain group rewind is. By
	// default they are removed, so that every message of the second run
	// reaches the claim check: the stricter test of your message ids.
	KeepPositions bool
	// Timeout bounds each run (default 60s).
	Timeout time.Duration
}

// ReplayTwice checks that replaying a topic applies nothing twice, with your
// real handler, message-id function and tables: it produces msgs to a topic
// of an in-process Kafka broker, runs a consumer configured by cfg until
// every message is settled, rewinds the consumer group to the beginning and
// runs it again, and fails the test if any of tables (names like
// "app.accounts") changed during the second run.
//
// Use NewMessage to build msgs; their Key, Value, Headers and Partition are
// produced. cfg needs Name, Handler and, unless the default suits, MessageID
// and Schema; ReplayTwice sets the Kafka fields itself. The schema is
// migrated if needed. Run it against a database the test owns: the
// consumer's claims and positions stay behind.
//
// Typical failures it catches: a message id that is not stable (derived from
// the time, a random value, a counter), effects written outside the
// handler's transaction, and tables changed by something other than the
// messages.
func ReplayTwice(tb testing.TB, db consumer.DB, cfg consumer.Config, msgs []*consumer.Message, tables []string, opts ...ReplayOptions) {
	tb.Helper()
	var o ReplayOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	ctx := context.Background()
	if cfg.Schema == "" {
		cfg.Schema = consumer.DefaultSchema
	}
	if _, err := consumer.Migrate(ctx, db, cfg.Schema); err != nil {
		tb.Fatalf("consumertest: migrate: %v", err)
	}
	idents := make([]string, len(tables))
	for i, t := range tables {
		idents[i] = pgx.Identifier(strings.Split(t, ".")).Sanitize()
	}

	broker, err := devenv.StartFakeKafka()
	if err != nil {
		tb.Fatalf("consumertest: %v", err)
	}
	defer broker.Close()
	const topic = "replay-twice"
	partitions := 1
	for _, m := range msgs {
		partitions = max(partitions, m.Partition+1)
	}
	if err := devenv.CreateTopic(ctx, broker.Brokers, topic, partitions); err != nil {
		tb.Fatalf("consumertest: %v", err)
	}
	produce(tb, broker.Brokers, topic, msgs)

	cfg.Brokers, cfg.Topics = broker.Brokers, []string{topic}
	cfg.GroupID = "replay-twice-" + cfg.Name
	cfg.SessionTimeout, cfg.HeartbeatInterval = 6*time.Second, 200*time.Millisecond
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}

	runUntilSettled(tb, db, cfg, len(msgs), o.Timeout, "first run")
	before := snapshot(tb, db, idents)

	admin := kafkaadmin.New(broker.Brokers, nil)
	defer admin.Close()
	start := map[int]int64{}
	for p := 0; p < partitions; p++ {
		start[p] = 0
	}
	if err := admin.CommitOffsets(ctx, cfg.GroupID, topic, start); err != nil {
		tb.Fatalf("consumertest: rewind the group: %v", err)
	}
	if !o.KeepPositions {
		positions, _ := offsets.NewStore(cfg.Schema) // Migrate took the name
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			_, err := positions.Forget(ctx, tx, cfg.Name, topic)
			return err
		})
		if err != nil {
			tb.Fatalf("consumertest: remove the stored positions: %v", err)
		}
	}

	runUntilSettled(tb, db, cfg, len(msgs), o.Timeout, "replay")
	after := snapshot(tb, db, idents)
	for i, t := range tables {
		if before[i] != after[i] {
			tb.Errorf("consumertest: replaying the topic changed table %s: %s before the replay, %s after; a message was applied twice (is its message id stable across deliveries?)",
				t, before[i], after[i])
		}
	}
}

func produce(tb testing.TB, brokers []string, topic string, msgs []*consumer.Message) {
	tb.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Transport: tr, BatchTimeout: time.Millisecond,
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition })}
	defer w.Close()
	km := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		km[i] = kafka.Message{Partition: m.Partition, Key: m.Key, Value: m.Value, Headers: m.Headers}
	}
	if err := w.WriteMessages(context.Background(), km...); err != nil {
		tb.Fatalf("consumertest: produce: %v", err)
	}
}

// settled counts messages the consumer finished with, one way or another.
type settled struct{ n atomic.Int64 }

func (s *settled) OnMessageApplied(context.Context, *consumer.Message) { s.n.Add(1) }
func (s *settled) OnMessageSkipped(context.Context, *consumer.Message, consumer.SkipReason) {
	s.n.Add(1)
}
func (s *settled) OnMessageDeadLettered(context.Context, *consumer.Message, consumer.DeadLettered) {
	s.n.Add(1)
}

func runUntilSettled(tb testing.TB, db consumer.DB, cfg consumer.Config, n int, timeout time.Duration, what string) {
	tb.Helper()
	count := &settled{}
	cfg.Hooks = append(append([]consumer.Hook(nil), cfg.Hooks...), count)
	c, err := consumer.New(db, &cfg)
	if err != nil {
		tb.Fatalf("consumertest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(timeout)
	for count.n.Load() < int64(n) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		tb.Fatalf("consumertest: %s: %v", what, err)
	}
	if got := count.n.Load(); got < int64(n) {
		tb.Fatalf("consumertest: %s: %d of %d messages settled within %v", what, got, n, timeout)
	}
}

// snapshot returns, per table, its row count and a digest of its rows.
func snapshot(tb testing.TB, db consumer.DB, idents []string) []string {
	tb.Helper()
	out := make([]string, len(idents))
	err := pgx.BeginFunc(context.Background(), db, func(tx pgx.Tx) error {
		for i, id := range idents {
			var n int64
			var digest string
			if err := tx.QueryRow(context.Background(), `SELECT count(*), coalesce(md5(string_agg(t::text, E'\n' ORDER BY t::text)), '') FROM `+id+` t`).Scan(&n, &digest); err != nil {
				return fmt.Errorf("read %s: %w", id, err)
			}
			out[i] = fmt.Sprintf("%d rows (digest %s)", n, digest[:min(len(digest), 8)])
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("consumertest: %v", err)
	}
	return out
}
