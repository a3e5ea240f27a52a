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
	"github.com/kafkaonce/kafkaonce/devenv/containers"
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
	ports := []string{"--pg-port", strconv.Itoa(pgPort), "--kafka-port", strconv.Itoa(kafkaPort)}
	printed, err := devPrintEnv(ports...)
	require.NoError(t, err, "dev --print-env, in another terminal, while dev runs")
	require.Equal(t, m[0], printed, "--print-env prints the line dev printed, and exits")
	require.Contains(t, errb.String(), `in another terminal: eval "$(kafkaonce dev --print-env`+" "+strings.Join(ports, " ")+`)"`)
	_, err = devPrintEnv("--pg-port", strconv.Itoa(pgPort+100), "--kafka-port", strconv.Itoa(kafkaPort))
	require.ErrorContains(t, err, fmt.Sprintf("no kafkaonce dev is running on ports %d and %d", pgPort+100, kafkaPort))

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
	_, err = devPrintEnv(ports...)
	require.ErrorContains(t, err, "no kafkaonce dev is running", "dev removed its line as it stopped")
	probe, err := pgx.Connect(context.Background(), dbURL+"&connect_timeout=2")
	if err == nil {
		probe.Close(context.Background())
		t.Fatal("Postgres still answers after dev stopped")
	}
}

// devPrintEnv runs kafkaonce dev --print-env with args, as in another
// terminal, and returns what it printed.
func devPrintEnv(args ...string) (string, error) {
	var out, errb lockedBuffer
	st := streams{in: strings.NewReader(""), out: &out, err: &errb, terminal: func() bool { return false }, getenv: func(string) string { return "" }}
	root, _ := newRootSettings(st)
	root.SetArgs(append([]string{"dev", "--print-env"}, args...))
	root.SetOut(&out)
	root.SetErr(&errb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := root.ExecuteContext(ctx)
	return out.String(), err
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

// devCommandEnv, set in a child process of the test binary, makes
// TestDevCommand run as the command kafkaonce dev runs.
const devCommandEnv = "KAFKAONCE_DEV_COMMAND"

// TestDevCommand is the command TestDevRunsACommand gives dev: it reaches
// both servers through the variables dev set, and exits with status 7.
func TestDevCommand(t *testing.T) {
	if os.Getenv(devCommandEnv) != "1" {
		t.Skip("run by TestDevRunsACommand as its command")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	require.NoError(t, err)
	var migrated bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('kafkaonce.processed_messages') IS NOT NULL`).Scan(&migrated))
	conn.Close(ctx)
	require.True(t, migrated, "dev migrated the schema before running the command")
	kc, err := kafka.DialContext(ctx, "tcp", os.Getenv("KAFKA_BROKERS"))
	require.NoError(t, err)
	_, err = kc.Brokers()
	kc.Close()
	require.NoError(t, err)
	os.Exit(7)
}

// kafkaonce dev -- command: the command runs against dev's servers, its
// exit status is dev's, and the servers stop after it.
func TestDevRunsACommand(t *testing.T) {
	t.Parallel()
	const pgPort, kafkaPort = 25753, 25754
	devArgs := []string{"dev", "--pg-port", strconv.Itoa(pgPort), "--kafka-port", strconv.Itoa(kafkaPort)}
	dev := func(ctx context.Context, args ...string) (error, string) {
		var out, errb lockedBuffer
		st := streams{in: strings.NewReader(""), out: &out, err: &errb, terminal: func() bool { return false }, getenv: func(string) string { return "" }}
		root, _ := newRootSettings(st)
		root.SetArgs(append(append([]string(nil), devArgs...), args...))
		root.SetOut(&out)
		root.SetErr(&errb)
		return root.ExecuteContext(ctx), out.String() + errb.String()
	}
	stopped := func(t *testing.T) {
		t.Helper()
		url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", pgPort)
		if probe, err := pgx.Connect(context.Background(), url); err == nil {
			probe.Close(context.Background())
			t.Fatal("Postgres still answers after dev returned")
		}
	}

	t.Run("its exit status is dev's", func(t *testing.T) {
		err, out := dev(context.Background(), "--", "env", devCommandEnv+"=1", os.Args[0], "-test.run", "^TestDevCommand$", "-test.count=1")
		var status exitStatus
		require.ErrorAs(t, err, &status, out)
		require.Equal(t, exitStatus(7), status, out)
		require.Contains(t, out, "running env "+devCommandEnv)
		stopped(t)
	})

	t.Run("Ctrl-C reaches the command, and dev waits for it", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		marker := t.TempDir() + "/started"
		done := make(chan struct{})
		var err error
		var out string
		go func() {
			defer close(done)
			err, out = dev(ctx, "--", "sh", "-c", `trap 'exit 5' TERM; touch `+marker+`; while :; do sleep 0.05; done`)
		}()
		waitUntil(t, 2*time.Minute, "the command started", func() bool { _, err := os.Stat(marker); return err == nil })
		cancel()
		<-done
		var status exitStatus
		require.ErrorAs(t, err, &status, out)
		require.Equal(t, exitStatus(5), status, "the command's own status on SIGTERM")
		stopped(t)
	})

	t.Run("a container asked for without an engine says why", func(t *testing.T) {
		if (containers.Docker{}).Check(context.Background()) == nil {
			t.Skip("a container engine answers on this machine")
		}
		err, _ := dev(context.Background(), "--kafka-container", "--", "true")
		require.ErrorContains(t, err, "dev: Kafka on port 25754")
		require.ErrorContains(t, err, "containers skipped: ")
		stopped(t)
	})

	t.Run("arguments before -- are refused", func(t *testing.T) {
		err, _ := dev(context.Background(), "go", "test")
		require.ErrorContains(t, err, "put the command to run after --")
	})
}
