package containers_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/devenv/containers"
)

// The test binary's Env runs Kafka (and Postgres, without local binaries)
// in containers when an engine answers, and says why not when none does:
// the same tests run either way.
func TestMain(m *testing.M) { devenv.Main(m, devenv.WithContainers(containers.Docker{})) }

// engine reports whether containers run here, and why not.
func engine() error { return containers.Docker{}.Check(context.Background()) }

// A consumer applies each message once against the Env, whichever way it
// came: a Kafka container where an engine answers, the in-process broker
// where none does.
func TestAConsumerRunsAgainstTheEnv(t *testing.T) {
	env := devenv.ForTest(t)
	switch err := engine(); {
	case os.Getenv("KAFKA_BROKERS") != "":
		t.Logf("kafka from KAFKA_BROKERS")
	case err == nil && env.KafkaSource != "container":
		t.Fatalf("an engine answers, and Kafka came from %q, not a container", env.KafkaSource)
	case err != nil && env.KafkaSource != "in-process":
		t.Fatalf("no engine (%v), and Kafka came from %q, not the in-process broker", err, env.KafkaSource)
	}
	t.Logf("%s", env)

	ctx := context.Background()
	topic := env.Topic(2)
	table := pgx.Identifier{env.Schema, "credits"}.Sanitize()
	if _, err := env.Pool.Exec(ctx, `CREATE TABLE `+table+` (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	var msgs []devenv.Message
	for _, id := range []string{"a", "b", "c", "a"} { // "a" sent twice, as a retrying producer would
		msgs = append(msgs, devenv.Message{ID: id, Key: []byte(id), Value: []byte("1")})
	}
	if err := env.Produce(ctx, topic, msgs...); err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int64
	cfg := &consumer.Config{Name: env.Name("credits"), Brokers: env.Brokers, Topics: []string{topic}, Schema: env.Schema,
		Hooks: []consumer.Hook{counted{&seen}},
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id) VALUES ($1)`, m.ID)
			return err
		})}
	c, err := consumer.New(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	deadline := time.Now().Add(2 * time.Minute)
	for seen.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var n int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if seen.Load() < 4 || n != 3 {
		t.Fatalf("%d messages seen, %d rows; want 4 seen and a, b, c once each", seen.Load(), n)
	}
}

// counted counts messages applied or skipped.
type counted struct{ n *atomic.Int64 }

func (c counted) OnMessageApplied(context.Context, *consumer.Message) { c.n.Add(1) }
func (c counted) OnMessageSkipped(context.Context, *consumer.Message, consumer.SkipReason) {
	c.n.Add(1)
}

// Where an engine answers, each container starts, serves, and is gone
// once removed.
func TestDockerStartsAndRemovesServers(t *testing.T) {
	if err := engine(); err != nil {
		t.Skipf("needs a container engine: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	t.Run("postgres", func(t *testing.T) {
		url, remove, err := containers.Docker{}.StartPostgres(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			_ = remove()
			t.Fatal(err)
		}
		var version int
		err = conn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version)
		conn.Close(ctx)
		if err != nil || version < 150000 {
			t.Errorf("server_version_num = %d, %v; want Postgres 15 or later", version, err)
		}
		if err := remove(); err != nil {
			t.Fatal(err)
		}
		if conn, err := pgx.Connect(ctx, url); err == nil {
			conn.Close(ctx)
			t.Fatal("the Postgres container still answers after its removal")
		}
	})

	t.Run("kafka", func(t *testing.T) {
		brokers, remove, err := containers.Docker{}.StartKafka(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		env := &devenv.Env{Brokers: brokers}
		err = env.CreateTopic(ctx, "containers_test", 3)
		if err == nil {
			err = env.Produce(ctx, "containers_test", devenv.Message{ID: "m1", Value: []byte("v")})
		}
		if rerr := remove(); rerr != nil {
			t.Error(rerr)
		}
		if err != nil {
			t.Fatal(err)
		}
	})
}

// startChildEnv, set in a child process of the test binary, makes
// TestStartChild start an Env with containers and print what it logged.
const startChildEnv = "KAFKAONCE_CONTAINERS_START_CHILD"

func TestStartChild(t *testing.T) {
	if os.Getenv(startChildEnv) == "" {
		t.Skip("runs only as the child of TestStartSaysWhyContainersWereSkipped")
	}
	logf := func(format string, args ...any) { fmt.Printf("log: "+format+"\n", args...) }
	env, err := devenv.Start(context.Background(), devenv.WithContainers(containers.Docker{}), devenv.WithLogf(logf))
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	fmt.Printf("sources: %s %s\n", env.PostgresSource, env.KafkaSource)
}

// When containers cannot run, Start says why in one line and runs
// Postgres and Kafka without them.
func TestStartSaysWhyContainersWereSkipped(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestStartChild$", "-test.v")
	cmd.Env = append(os.Environ(), startChildEnv+"=1", "KAFKAONCE_DOCKER=off", "KAFKA_BROKERS=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child failed: %v\n%s", err, out)
	}
	want := "log: devenv: containers skipped: KAFKAONCE_DOCKER=off; Postgres from DATABASE_URL or the local binaries, Kafka from KAFKA_BROKERS or in the process\n"
	if !strings.Contains(string(out), want) {
		t.Errorf("no line saying why containers were skipped; want %q in:\n%s", want, out)
	}
	if !strings.Contains(string(out), "sources: DATABASE_URL in-process\n") && !strings.Contains(string(out), "sources: local binaries in-process\n") {
		t.Errorf("Start did not fall back to Postgres without containers and the in-process broker:\n%s", out)
	}
}
