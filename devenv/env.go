package devenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

// Env is a Postgres database and a Kafka broker to run consumers against.
type Env struct {
	// DatabaseURL connects to the database as a user who may create
	// schemas (a superuser, for a server devenv started).
	DatabaseURL string
	// Pool is a connection pool to DatabaseURL.
	Pool *pgxpool.Pool
	// Brokers are the Kafka bootstrap addresses.
	Brokers []string
	// PostgresSource says where the database came from: "DATABASE_URL",
	// "local binaries" or "container".
	PostgresSource string
	// KafkaSource says where the broker came from: "KAFKA_BROKERS",
	// "container" or "in-process".
	KafkaSource string

	pg *devenv.Postgres
	kf *devenv.Kafka
	// owned are the schemas Close drops (see Own).
	owned []string
}

// Own makes Close drop schemaName, with everything in it, unless the
// program was told to keep it (-keep of RegisterFlags, or
// KAFKAONCE_KEEP=1): for the schema an example or a tool makes for itself,
// so that a database it was pointed at (DATABASE_URL, kafkaonce dev) does
// not collect them, and tools that find kafkaonce's schema by themselves
// are not left to choose between several.
func (e *Env) Own(schemaName string) { e.owned = append(e.owned, schemaName) }

// Start finds or starts Postgres and Kafka (see the package doc for where
// each comes from) and opens a pool. The error of a machine that offers no
// Postgres says what to install or set. Close stops what Start started.
func Start(ctx context.Context, opts ...Option) (*Env, error) {
	// A nil ContainerRuntime converts to a nil devenv.Containers: none.
	var containers devenv.Containers = newOptions(opts).checkedContainers(ctx)
	pg, err := devenv.StartPostgres(ctx, containers)
	if err != nil {
		return nil, err
	}
	kf, err := devenv.StartKafka(ctx, containers)
	if err != nil {
		_ = pg.Close()
		return nil, err
	}
	pool, err := pgxpool.New(ctx, pg.URL)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		return nil, errors.Join(fmt.Errorf("devenv: connect to Postgres (%s): %w", pg.Source, err), kf.Close(), pg.Close())
	}
	return &Env{DatabaseURL: pg.URL, Pool: pool, Brokers: kf.Brokers, PostgresSource: pg.Source, KafkaSource: kf.Source, pg: pg, kf: kf}, nil
}

// Close drops the schemas the program owns (see Own), closes the pool and
// stops the servers Start started; servers named by DATABASE_URL and
// KAFKA_BROKERS keep running. A throwaway cluster's data is deleted.
func (e *Env) Close() error {
	var errs []error
	if os.Getenv(devenv.KeepEnv) != "1" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, name := range e.owned {
			if _, err := e.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`); err != nil {
				errs = append(errs, fmt.Errorf("devenv: drop schema %s (run with -keep to keep it): %w", name, err))
			}
		}
	}
	e.Pool.Close()
	return errors.Join(append(errs, e.kf.Close(), e.pg.Close())...)
}

// String says where the database and the broker came from, for a log line.
func (e *Env) String() string {
	return fmt.Sprintf("postgres: %s; kafka: %s %v", e.PostgresSource, e.KafkaSource, e.Brokers)
}
