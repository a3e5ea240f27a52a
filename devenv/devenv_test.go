package devenv_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

func TestMain(m *testing.M) { devenv.Main(m) }

func TestTheMessageIDHeaderIsTheConsumersDefault(t *testing.T) {
	if devenv.MessageIDHeader != consumer.DefaultMessageIDHeader {
		t.Fatalf("devenv.MessageIDHeader = %q, consumer.DefaultMessageIDHeader = %q", devenv.MessageIDHeader, consumer.DefaultMessageIDHeader)
	}
}

// counting counts applied and skipped messages.
type counting struct{ applied, skipped atomic.Int64 }

func (c *counting) OnMessageApplied(context.Context, *consumer.Message) { c.applied.Add(1) }
func (c *counting) OnMessageSkipped(context.Context, *consumer.Message, consumer.SkipReason) {
	c.skipped.Add(1)
}

// TestAConsumerRunsAgainstTheTestEnv is what a user's first test does:
// produce, consume, rewind, consume again, with nothing applied twice.
func TestAConsumerRunsAgainstTheTestEnv(t *testing.T) {
	var schemaName string
	t.Run("run", func(t *testing.T) {
		env := devenv.ForTest(t)
		schemaName = env.Schema
		ctx := context.Background()
		topic := env.Topic(2)
		table := pgx.Identifier{env.Schema, "credits"}.Sanitize()
		if _, err := env.Pool.Exec(ctx, `CREATE TABLE `+table+` (id text NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		var msgs []devenv.Message
		for _, id := range []string{"a", "b", "c", "a"} { // "a" re-sent, as a retrying producer would
			msgs = append(msgs, devenv.Message{ID: id, Key: []byte(id), Value: []byte("1")})
		}
		if err := env.Produce(ctx, topic, msgs...); err != nil {
			t.Fatal(err)
		}
		counts := &counting{}
		cfg := &consumer.Config{Name: env.Name("credits"), Brokers: env.Brokers, Topics: []string{topic}, Schema: env.Schema,
			Hooks: []consumer.Hook{counts}, SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond,
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id) VALUES ($1)`, m.ID)
				return err
			})}
		consumeUntil(t, env, cfg, func() bool { return counts.applied.Load()+counts.skipped.Load() >= 4 })
		if err := env.Rewind(ctx, cfg.Name, topic); err != nil {
			t.Fatal(err)
		}
		// Forget the stored positions too, so that each message of the
		// replay meets its claim and is skipped as a duplicate.
		positions, err := offsets.NewStore(env.Schema)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := positions.Forget(ctx, env.Pool, cfg.Name, topic); err != nil {
			t.Fatal(err)
		}
		skipped := counts.skipped.Load()
		consumeUntil(t, env, cfg, func() bool { return counts.skipped.Load() >= skipped+4 })
		var n int
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 3 || counts.applied.Load() != 3 {
			t.Fatalf("%d rows, %d applied; want 3 and 3 (a, b, c once each)", n, counts.applied.Load())
		}
	})
	var exists bool
	env := devenv.ForTest(t)
	if err := env.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schemaName).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("schema %s outlived its test", schemaName)
	}
	if !strings.HasPrefix(env.Schema, "t_testaconsumerrunsagainstthetestenv_") {
		t.Errorf("schema %s is not named after the test", env.Schema)
	}
}

func consumeUntil(t *testing.T, env *devenv.TestEnv, cfg *consumer.Config, done func() bool) {
	t.Helper()
	c, err := consumer.New(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	deadline := time.Now().Add(time.Minute)
	for !done() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !done() {
		t.Fatal("the consumer did not get through the topic within a minute")
	}
}
