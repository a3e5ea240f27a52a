// Command quickstart is the smallest complete kafkaonce worker, runnable with
// no setup:
//
//	go run ./examples/quickstart
//
// It imports only kafkaonce's public packages, so it can be copied into a
// module of your own as it is and run there the same way.
//
// It starts an in-process Kafka broker (or uses KAFKA_BROKERS) and a
// throwaway Postgres (or uses DATABASE_URL), produces credit messages of
// which some are re-sent by a "retrying producer", applies them with a
// consumer, then rewinds the consumer group to the beginning and replays the
// whole topic. The last line is a JSON summary; the exit code is 0 only if
// every credit was applied exactly once.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
)

type summary struct {
	Postgres          string `json:"postgres"`
	Kafka             string `json:"kafka"`
	Produced          int    `json:"produced"`
	Unique            int    `json:"unique"`
	Applied           int64  `json:"applied"`
	DuplicatesSkipped int64  `json:"duplicates_skipped"`
	Replayed          int    `json:"replayed"`
	AppliedOnReplay   int64  `json:"applied_on_replay"`
	DoubleApplied     int64  `json:"double_applied"`
	OK                bool   `json:"ok"`
}

func main() {
	n := flag.Int("messages", 1000, "unique credits to produce")
	resend := flag.Int("resend-every", 10, "re-send every Nth credit, as a retrying producer would")
	applyEnv := devenv.RegisterFlags(flag.CommandLine)
	flag.Parse()
	applyEnv()
	log.SetFlags(0)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *n, *resend); err != nil {
		log.Fatalf("quickstart: %v", err)
	}
}

func run(ctx context.Context, n, resend int) error {
	// A Postgres and a Kafka broker: DATABASE_URL and KAFKA_BROKERS when
	// set, else a throwaway local cluster and an in-process broker.
	env, err := devenv.Start(ctx)
	if err != nil {
		return err
	}
	defer env.Close()
	log.Print(env)
	pool := env.Pool
	// kafkaonce's own tables, then the example's effect table next to them,
	// in a schema of the example's: dropped when it ends, unless -keep.
	const schema = "kafkaonce_quickstart"
	env.Own(schema)
	if _, err := consumer.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS kafkaonce_quickstart.credits (
		run text NOT NULL, credit_id text NOT NULL, amount bigint NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}

	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := "quickstart-" + runID
	if err := env.CreateTopic(ctx, topic, 3); err != nil {
		return err
	}
	produced, err := produce(ctx, env, topic, n, resend)
	if err != nil {
		return err
	}
	log.Printf("produced %d messages for %d unique credits on %s", produced, n, topic)

	// The handler: one row per credit. The table has no unique key: only
	// kafkaonce stands between a redelivery and a double credit.
	credit := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		amount, err := strconv.ParseInt(string(m.Value), 10, 64)
		if err != nil {
			return fmt.Errorf("credit %s: %w", m.ID, err)
		}
		_, err = tx.Exec(ctx, `INSERT INTO kafkaonce_quickstart.credits (run, credit_id, amount) VALUES ($1, $2, $3)`, runID, m.ID, amount)
		return err
	})
	counts := &counter{}
	cfg := &consumer.Config{
		Name:              "quickstart-" + runID,
		Brokers:           env.Brokers,
		Topics:            []string{topic},
		Schema:            schema,
		Handler:           credit,
		Hooks:             []consumer.Hook{counts},
		Logger:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: time.Second,
	}

	// First pass: everything, duplicates included.
	if err := consumeUntil(ctx, pool, cfg, func() bool { return counts.seen() >= int64(produced) }); err != nil {
		return err
	}
	s := summary{Postgres: env.PostgresSource, Kafka: env.KafkaSource, Produced: produced, Unique: n,
		Applied: counts.applied.Load(), DuplicatesSkipped: counts.skipped.Load()}
	log.Printf("first pass: applied %d, skipped %d duplicates", s.Applied, s.DuplicatesSkipped)

	// Replay: rewind the group to the start of the topic and run again.
	if err := env.Rewind(ctx, cfg.Name, topic); err != nil {
		return err
	}
	before := counts.applied.Load()
	if err := consumeUntil(ctx, pool, cfg, func() bool { return counts.assigned.Load() >= 6 }); err != nil {
		return err
	}
	s.Replayed = produced
	s.AppliedOnReplay = counts.applied.Load() - before
	log.Printf("replay of %d messages from offset 0: applied %d", produced, s.AppliedOnReplay)

	if err := pool.QueryRow(ctx, `SELECT count(*) - count(DISTINCT credit_id) FROM kafkaonce_quickstart.credits WHERE run = $1`, runID).Scan(&s.DoubleApplied); err != nil {
		return err
	}
	var rows int64
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT credit_id) FROM kafkaonce_quickstart.credits WHERE run = $1`, runID).Scan(&rows); err != nil {
		return err
	}
	s.OK = rows == int64(n) && s.DoubleApplied == 0 && s.AppliedOnReplay == 0
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
	if !s.OK {
		return errors.New("a credit was lost or applied twice")
	}
	return nil
}

// produce writes n credits (id "credit-i", amount i) and re-sends every
// resend-th one with the same id and content.
func produce(ctx context.Context, env *devenv.Env, topic string, n, resend int) (int, error) {
	var msgs []devenv.Message
	for i := range n {
		id := "credit-" + strconv.Itoa(i)
		m := devenv.Message{ID: id, Key: []byte(id), Value: []byte(strconv.Itoa(i))}
		msgs = append(msgs, m)
		if resend > 0 && i%resend == 0 {
			msgs = append(msgs, m)
		}
	}
	return len(msgs), env.Produce(ctx, topic, msgs...)
}

// consumeUntil runs a consumer until done reports true, then shuts it down.
func consumeUntil(ctx context.Context, pool *pgxpool.Pool, cfg *consumer.Config, done func() bool) error {
	c, err := consumer.New(pool, cfg)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	deadline := time.After(2 * time.Minute)
	for !done() {
		select {
		case err := <-errc:
			return fmt.Errorf("consumer stopped early: %v", err)
		case <-deadline:
			cancel()
			<-errc
			return errors.New("timed out waiting for the consumer")
		case <-time.After(50 * time.Millisecond):
		}
	}
	cancel()
	return <-errc
}

// counter is a hook counting what the consumer did.
type counter struct {
	applied, skipped, assigned atomic.Int64
}

func (c *counter) OnMessageApplied(context.Context, *consumer.Message) { c.applied.Add(1) }
func (c *counter) OnMessageSkipped(context.Context, *consumer.Message, consumer.SkipReason) {
	c.skipped.Add(1)
}
func (c *counter) OnPartitionAssigned(context.Context, consumer.PartitionAssignment) {
	c.assigned.Add(1)
}
func (c *counter) seen() int64 { return c.applied.Load() + c.skipped.Load() }
