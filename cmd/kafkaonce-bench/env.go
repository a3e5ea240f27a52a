package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/pgcluster"
)

// env is what every run uses.
type env struct {
	brokers     []string
	brokerDesc  string
	pgDesc      string
	db          *pgxpool.Pool
	wire        *wireCounters
	kafkaDialer *kafka.Dialer
	transport   *kafka.Transport
	log         *slog.Logger
	verbose     bool
	closers     []func()
}

func (e *env) kafkaClient() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(e.brokers...), Transport: e.transport}
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// durablePostgres are the settings of the throwaway server: durable
// commits (fsync and synchronous commit on, as in production, so a
// per-message loop pays for its commits as it would there) and memory for
// a ten-million-row table.
var durablePostgres = map[string]string{
	"fsync":              "on",
	"synchronous_commit": "on",
	"full_page_writes":   "on",
	"shared_buffers":     "2GB",
	"max_wal_size":       "8GB",
	"checkpoint_timeout": "30min",
}

// openEnv starts the environment a mode of the program runs in, from
// KAFKA_BROKERS and DATABASE_URL (each started here when unset), with a
// pool of conns connections and the benchmark's tables made. The caller
// closes it.
func openEnv(ctx context.Context, log *slog.Logger, o options, conns int) (*env, error) {
	e, err := startEnv(ctx, log, os.Getenv("KAFKA_BROKERS"), os.Getenv("DATABASE_URL"), conns)
	if err != nil {
		return nil, err
	}
	e.verbose = o.verbose
	if err := setupTables(ctx, e.db); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func startEnv(ctx context.Context, log *slog.Logger, brokers, databaseURL string, conns int) (*env, error) {
	e := &env{wire: &wireCounters{}, log: log}
	e.kafkaDialer = &kafka.Dialer{Timeout: 10 * time.Second, DualStack: true, DialFunc: e.wire.kafkaDial}
	e.transport = &kafka.Transport{Dial: e.wire.kafkaDial, MetadataTTL: time.Second}
	if brokers != "" {
		e.brokers, e.brokerDesc = devenv.SplitBrokers(brokers), "Kafka at "+brokers
	} else {
		addr, stop, err := startBrokerProcess(ctx)
		if err != nil {
			return nil, err
		}
		e.closers = append(e.closers, stop)
		e.brokers, e.brokerDesc = []string{addr}, "kfake (in-process Kafka-protocol broker, in a child process)"
	}
	url := databaseURL
	if url == "" {
		c, err := pgcluster.Start(ctx, durablePostgres)
		if err != nil {
			e.close()
			return nil, fmt.Errorf("start Postgres from the local binaries (or pass -database-url): %w", err)
		}
		e.closers = append(e.closers, func() { _ = c.Stop() })
		url, e.pgDesc = c.URL(), "throwaway local PostgreSQL (fsync and synchronous_commit on, shared_buffers 2GB)"
	} else {
		e.pgDesc = "the server at -database-url"
	}
	var version string
	db, err := openPool(ctx, url, e.wire, conns)
	if err == nil {
		err = db.QueryRow(ctx, "SHOW server_version").Scan(&version)
	}
	if err != nil {
		e.close()
		return nil, fmt.Errorf("connect to Postgres: %w", err)
	}
	e.pgDesc = "PostgreSQL " + version + ", " + e.pgDesc
	e.db = db
	e.closers = append(e.closers, db.Close)
	// Open every connection now, so that no run pays for the pool's
	// connection set-up (and its round trips are not counted as the run's).
	var held []*pgxpool.Conn
	for range conns {
		c, err := db.Acquire(ctx)
		if err != nil {
			e.close()
			return nil, err
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	return e, nil
}

// The broker runs in a child process (this program, re-executed with
// serveBrokerArg), so its memory and allocations are not counted as the
// consumer's: peak RSS and allocations per message describe the consumer
// alone.
const serveBrokerArg = "serve-kfake-broker"

func startBrokerProcess(ctx context.Context) (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(self, serveBrokerArg)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("start the broker process: %w", err)
	}
	stop := func() { stdin.Close(); _ = cmd.Wait() }
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("the broker process did not report its address: %w", err)
	}
	return strings.TrimSpace(line), stop, nil
}

// serveBroker runs kfake until stdin closes (the parent exited).
func serveBroker() {
	signal.Ignore(os.Interrupt)
	k, err := devenv.StartFakeKafka()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(k.Brokers[0])
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = k.Close()
}
