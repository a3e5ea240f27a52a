package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

// The ports kafkaonce dev listens on by default: fixed, so that the printed
// variables stay right from one run to the next, and below Linux's
// ephemeral range (32768-60999), so that no outgoing connection holds them.
const (
	defaultDevPostgresPort = 15432
	defaultDevKafkaPort    = 19092
)

func devCmd(s *settings) *cobra.Command {
	var pgPort, kafkaPort int
	var kafkaContainer bool
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a Postgres and a Kafka broker for development until Ctrl-C or SIGTERM",
		Long: `dev starts a Postgres server and a Kafka broker that outlive the programs you
run against them: kill -9 your worker or your API, start it again, and it finds
the same tables, topics and group offsets. It migrates kafkaonce's tables
(--schema, default "kafkaonce"), prints the variables to export, and runs until
Ctrl-C or SIGTERM, then stops both and removes what it started.

Postgres comes from the local server binaries (initdb, pg_ctl; as the postgres
user when run as root), else a container when Docker answers. Kafka is the
in-process broker (the Kafka protocol over TCP, consumer groups and
transactions included; its data lives as long as dev runs), or Apache Kafka in
a container with --kafka-container. DATABASE_URL and KAFKA_BROKERS are not
read: dev always starts its own.

  eval "$(kafkaonce dev | head -1)"   # in one terminal, or copy the line
  go run ./examples/quickstart         # in another, after the export`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), s, pgPort, kafkaPort, kafkaContainer)
		},
	}
	f := cmd.Flags()
	f.IntVar(&pgPort, "pg-port", defaultDevPostgresPort, "loopback port of the Postgres server")
	f.IntVar(&kafkaPort, "kafka-port", defaultDevKafkaPort, "loopback port of the Kafka broker")
	f.BoolVar(&kafkaContainer, "kafka-container", false, "run Apache Kafka in a container (needs Docker) instead of the in-process broker")
	return cmd
}

func runDev(ctx context.Context, s *settings, pgPort, kafkaPort int, kafkaContainer bool) error {
	for name, p := range map[string]int{"--pg-port": pgPort, "--kafka-port": kafkaPort} {
		if p <= 0 || p > 65535 {
			return fmt.Errorf("%s %d is not a TCP port: give one from 1 to 65535 (best below 32768, outside the ephemeral range)", name, p)
		}
	}
	if pgPort == kafkaPort {
		return fmt.Errorf("--pg-port and --kafka-port are both %d: give them different ports", pgPort)
	}
	name := consumer.DefaultSchema
	if s.given("schema") {
		name = s.schema
	}
	pg, err := devenv.StartPostgresOn(ctx, pgPort)
	if err != nil {
		return fmt.Errorf("dev: Postgres on port %d (is another server using it? choose another with --pg-port): %w", pgPort, err)
	}
	defer func() {
		if err := pg.Close(); err != nil {
			fmt.Fprintln(s.st.err, "dev: stopping Postgres:", err)
		}
	}()
	kf, err := devenv.StartKafkaOn(ctx, kafkaPort, kafkaContainer)
	if err != nil {
		return fmt.Errorf("dev: Kafka on port %d (is another broker using it? choose another with --kafka-port): %w", kafkaPort, err)
	}
	defer func() { _ = kf.Close() }()

	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		return err
	}
	version, err := consumer.Migrate(ctx, pool, name)
	pool.Close()
	if err != nil {
		return fmt.Errorf("dev: migrate schema %s: %w", name, err)
	}

	// The first line is the one to eval; the rest say what runs.
	brokers := strings.Join(kf.Brokers, ",")
	fmt.Fprintf(s.st.out, "export DATABASE_URL='%s' KAFKA_BROKERS='%s'\n", pg.URL, brokers)
	fmt.Fprintf(s.st.err, "postgres: %s on 127.0.0.1:%d; schema %s at version %d\n", pg.Source, pgPort, name, version)
	fmt.Fprintf(s.st.err, "kafka: %s at %s\n", kf.Source, brokers)
	fmt.Fprintln(s.st.err, "running until Ctrl-C or SIGTERM; both stop then, and what they stored goes with them")
	<-ctx.Done()
	fmt.Fprintln(s.st.err, "stopping")
	return nil
}
