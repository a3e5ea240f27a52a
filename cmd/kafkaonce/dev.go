package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv/containers"
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
	var o devOptions
	cmd := &cobra.Command{
		Use:   "dev [flags] [-- command [args...]]",
		Short: "Run a Postgres and a Kafka broker for development, or for one command",
		Long: `dev starts a Postgres server and a Kafka broker that outlive the programs you
run against them: kill -9 your worker or your API, start it again, and it finds
the same tables, topics and group offsets. It migrates kafkaonce's tables
(--schema, default "kafkaonce"), prints the variables to export, and runs until
Ctrl-C or SIGTERM, then stops both and removes what it started.

--print-env prints the line to export of the dev running on the ports given
(the defaults: --pg-port and --kafka-port as dev was started with), and exits:
what to eval in another terminal, since dev's own output ends only when dev
does.

Given a command after --, dev runs it with DATABASE_URL and KAFKA_BROKERS set,
stops both servers when it exits, and exits with its status.

Postgres comes from the local server binaries (initdb, pg_ctl; as the postgres
user when run as root), else a container when a container engine answers, or
always a container with --postgres-container. Kafka is the in-process broker
(the Kafka protocol over TCP, consumer groups and transactions included; its
data lives as long as dev runs), or Apache Kafka in a container with
--kafka-container. Containers run through testcontainers-go (Docker, Docker
Desktop, Colima, Podman; KAFKAONCE_DOCKER=off skips them). DATABASE_URL and
KAFKA_BROKERS are not read: dev always starts its own.

  kafkaonce dev                        # in one terminal: runs until Ctrl-C
  eval "$(kafkaonce dev --print-env)"  # in another: prints the line and exits
  go run ./examples/quickstart         # there, after the export

  kafkaonce dev --kafka-container -- go test ./...   # tests against a real broker`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if n := cmd.ArgsLenAtDash(); n > 0 || (n < 0 && len(args) > 0) {
				return fmt.Errorf("dev takes no arguments before --: put the command to run after -- (kafkaonce dev -- %s)", strings.Join(args, " "))
			}
			o.command = args
			if o.printEnv {
				if len(args) > 0 {
					return errors.New("--print-env runs no command: leave out what follows --")
				}
				exports, err := readDevEnv(devEnvFile(s, o.pgPort, o.kafkaPort), o.pgPort, o.kafkaPort)
				if err != nil {
					return err
				}
				fmt.Fprintln(s.st.out, exports)
				return nil
			}
			return runDev(cmd.Context(), s, o)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.pgPort, "pg-port", defaultDevPostgresPort, "loopback port of the Postgres server")
	f.IntVar(&o.kafkaPort, "kafka-port", defaultDevKafkaPort, "loopback port of the Kafka broker")
	f.BoolVar(&o.postgresContainer, "postgres-container", false, "run Postgres in a container (needs a container engine) even where local binaries are installed")
	f.BoolVar(&o.kafkaContainer, "kafka-container", false, "run Apache Kafka in a container (needs a container engine) instead of the in-process broker")
	f.BoolVar(&o.printEnv, "print-env", false, "print the line to export of the dev running on --pg-port and --kafka-port, and exit (for eval in another terminal)")
	return cmd
}

// devOptions are dev's flags and its command.
type devOptions struct {
	pgPort, kafkaPort                 int
	postgresContainer, kafkaContainer bool
	printEnv                          bool
	command                           []string
}

// exitStatus makes kafkaonce exit with the status of the command dev ran.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("the command exited with status %d", int(e)) }

func runDev(ctx context.Context, s *settings, o devOptions) error {
	for name, p := range map[string]int{"--pg-port": o.pgPort, "--kafka-port": o.kafkaPort} {
		if p <= 0 || p > 65535 {
			return fmt.Errorf("%s %d is not a TCP port: give one from 1 to 65535 (best below 32768, outside the ephemeral range)", name, p)
		}
	}
	if o.pgPort == o.kafkaPort {
		return fmt.Errorf("--pg-port and --kafka-port are both %d: give them different ports", o.pgPort)
	}
	name := consumer.DefaultSchema
	if s.given("schema") {
		name = s.schema
	}
	rt := containers.Docker{}
	pg, err := devenv.StartPostgresOn(ctx, o.pgPort, rt, o.postgresContainer)
	if err != nil {
		return fmt.Errorf("dev: Postgres on port %d (is another server using it? choose another with --pg-port): %w", o.pgPort, err)
	}
	defer func() {
		if err := pg.Close(); err != nil {
			fmt.Fprintln(s.st.err, "dev: stopping Postgres:", err)
		}
	}()
	kf, err := devenv.StartKafkaOn(ctx, o.kafkaPort, rt, o.kafkaContainer)
	if err != nil {
		return fmt.Errorf("dev: Kafka on port %d (is another broker using it? choose another with --kafka-port): %w", o.kafkaPort, err)
	}
	defer func() {
		if err := kf.Close(); err != nil {
			fmt.Fprintln(s.st.err, "dev: stopping Kafka:", err)
		}
	}()

	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		return err
	}
	version, err := consumer.Migrate(ctx, pool, name)
	pool.Close()
	if err != nil {
		return fmt.Errorf("dev: migrate schema %s: %w", name, err)
	}

	brokers := strings.Join(kf.Brokers, ",")
	if len(o.command) > 0 {
		fmt.Fprintf(s.st.err, "postgres: %s on 127.0.0.1:%d; kafka: %s at %s; running %s\n", pg.Source, o.pgPort, kf.Source, brokers, strings.Join(o.command, " "))
		return runWithEnv(ctx, s, o.command, pg.URL, brokers)
	}
	// The first line is the one to export, which --print-env prints in
	// another terminal; the rest say what runs.
	exports := fmt.Sprintf("export DATABASE_URL='%s' KAFKA_BROKERS='%s'", pg.URL, brokers)
	remove, err := writeDevEnv(devEnvFile(s, o.pgPort, o.kafkaPort), exports)
	if err != nil {
		return err
	}
	defer remove()
	fmt.Fprintln(s.st.out, exports)
	fmt.Fprintf(s.st.err, "postgres: %s on 127.0.0.1:%d; schema %s at version %d\n", pg.Source, o.pgPort, name, version)
	fmt.Fprintf(s.st.err, "kafka: %s at %s\n", kf.Source, brokers)
	fmt.Fprintf(s.st.err, "in another terminal: eval \"$(kafkaonce dev --print-env%s)\"\n", portFlags(o))
	fmt.Fprintln(s.st.err, "running until Ctrl-C or SIGTERM; both stop then, and what they stored goes with them")
	<-ctx.Done()
	fmt.Fprintln(s.st.err, "stopping")
	return nil
}

// portFlags are the port flags that name o's ports, when not the defaults.
func portFlags(o devOptions) string {
	var f string
	if o.pgPort != defaultDevPostgresPort {
		f += fmt.Sprintf(" --pg-port %d", o.pgPort)
	}
	if o.kafkaPort != defaultDevKafkaPort {
		f += fmt.Sprintf(" --kafka-port %d", o.kafkaPort)
	}
	return f
}

// runWithEnv runs command with the servers' variables set and dev's
// streams as its own. Ctrl-C or SIGTERM reach it as SIGTERM, and dev waits
// for it to exit before it stops the servers it needs.
func runWithEnv(ctx context.Context, s *settings, command []string, databaseURL, brokers string) error {
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+databaseURL, "KAFKA_BROKERS="+brokers)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s.st.in, s.st.out, s.st.err
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("dev: run %s: %w", command[0], err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM)
		err = <-exited
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exitStatus(exit.ExitCode())
	default:
		return fmt.Errorf("dev: %s: %w", command[0], err)
	}
}
