package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// lockedBuffer is a bytes.Buffer a command writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// devWorkerEnv, set in a child process of the test binary, makes
// TestDevWorker run as a worker against kafkaonce dev's servers.
const devWorkerEnv = "KAFKAONCE_DEV_WORKER"

// kafkaonce dev, with a worker killed with SIGKILL mid-run and started
// again: the servers outlive the worker, and every message is applied
// exactly once across the two. Then dev stops on its context, as on Ctrl-C
// or SIGTERM, and takes its servers down.
func TestDevOutlivesAKilledWorker(t *testing.T) {
	t.Parallel()
	const pgPort, kafkaPort, messages = 25751, 25752, 3000
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var out, errb lockedBuffer
	st := streams{in: strings.NewReader(""), out: &out, err: &errb, terminal: func() bool { return false }, getenv: func(string) string { return "" }}
	root, _ := newRootSettings(st)
	root.SetArgs([]string{"dev", "--pg-port", strconv.Itoa(pgPort), "--kafka-port", strconv.Itoa(kafkaPort)})
	root.SetOut(&out)
	root.SetErr(&errb)
	devDone := make(chan error, 1)
	go func() { devDone <- root.ExecuteContext(ctx) }()

	exports := regexp.MustCompile(`^export DATABASE_URL='([^']+)' KAFKA_BROKERS='([^']+)'\n`)
	var m []string
	waitUntil(t, 2*time.Minute, "dev printed its exports", func() bool {
		select {
		case err := <-devDone:
			t.Fatalf("dev ended early: %v\n%s", err, errb.String())
		default:
		}
		m = exports.FindStringSubmatch(out.String())
		return m != nil
	})
	dbURL, brokers := m[1], m[2]
	require.Equal(t, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pgPort), dbURL)
	require.Equal(t, fmt.Sprintf("127.0.0.1:%d", kafkaPort), brokers)
	require.Contains(t, errb.String(), "schema kafkaonce at version")

	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	defer pool.Close()
	_, err = pool.Exec(ctx, `CREATE TABLE kafkaonce.dev_effects (message_id text NOT NULL)`)
	require.NoError(t, err)
	conn, err := kafka.DialContext(ctx, "tcp", brokers)
	require.NoError(t, err)
	require.NoError(t, conn.CreateTopics(kafka.TopicConfig{Topic: "credits", NumPartitions: 2, ReplicationFactor: 1}))
	conn.Close()
	w := &kafka.Writer{Addr: kafka.TCP(brokers), Topic: "credits", Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond, BatchSize: 500}
	var msgs []kafka.Message
	for i := range messages {
		id := "credit-" + strconv.Itoa(i)
		msgs = append(msgs, kafka.Message{Key: []byte(id), Value: []byte("1"), Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}})
	}
	require.NoError(t, w.WriteMessages(ctx, msgs...))
	require.NoError(t, w.Close())

	count := func(q string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, q).Scan(&n))
		return n
	}
	worker := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestDevWorker$", "-test.count=1")
		cmd.Env = append(os.Environ(), devWorkerEnv+"=1", "DATABASE_URL="+dbURL, "KAFKA_BROKERS="+brokers)
		var logs lockedBuffer
		cmd.Stdout, cmd.Stderr = &logs, &logs
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}

	first := worker()
	waitUntil(t, time.Minute, "the first worker applied some", func() bool {
		return count(`SELECT count(*) FROM kafkaonce.dev_effects`) >= messages/10
	})
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	require.Less(t, count(`SELECT count(*) FROM kafkaonce.dev_effects`), messages, "the first worker was killed mid-run")

	second := worker()
	waitUntil(t, 2*time.Minute, "the second worker applied the rest", func() bool {
		return count(`SELECT count(DISTINCT message_id) FROM kafkaonce.dev_effects`) == messages
	})
	require.NoError(t, second.Process.Signal(syscall.SIGTERM))
	require.NoError(t, second.Wait(), "the worker drains on SIGTERM")
	require.Equal(t, messages, count(`SELECT count(*) FROM kafkaonce.dev_effects`), "a message was applied twice")
	pool.Close()

	stop()
	select {
	case err := <-devDone:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("dev did not stop")
	}
	require.Contains(t, errb.String(), "stopping")
	probe, err := pgx.Connect(context.Background(), dbURL+"&connect_timeout=2")
	if err == nil {
		probe.Close(context.Background())
		t.Fatal("Postgres still answers after dev stopped")
	}
}

// TestDevWorker is the worker TestDevOutlivesAKilledWorker runs as a child
// process; it does nothing in a plain test run.
func TestDevWorker(t *testing.T) {
	if os.Getenv(devWorkerEnv) != "1" {
		t.Skip("run by TestDevOutlivesAKilledWorker as its worker")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	require.NoError(t, err)
	defer pool.Close()
	c, err := consumer.New(pool, &consumer.Config{
		Name: "dev-worker", GroupID: "dev-worker", Brokers: strings.Split(os.Getenv("KAFKA_BROKERS"), ","), Topics: []string{"credits"},
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, MaxBatch: 50,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			time.Sleep(time.Millisecond) // slow enough to be killed mid-run
			_, err := tx.Exec(ctx, `INSERT INTO kafkaonce.dev_effects VALUES ($1)`, m.ID)
			return err
		}),
	})
	require.NoError(t, err)
	if err := c.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// waitUntil polls cond until it holds, failing the test after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
