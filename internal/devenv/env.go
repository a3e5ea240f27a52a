package devenv

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Env is what an example program runs against: a Postgres server with a
// pool, and a Kafka broker.
type Env struct {
	Postgres *Postgres
	Kafka    *Kafka
	Pool     *pgxpool.Pool
}

// StartEnv finds or starts Postgres (local binaries before Docker) and Kafka
// (in-process unless KAFKA_BROKERS is set), opens a pool, and logs where
// they came from. Close releases all of it.
func StartEnv(ctx context.Context) (*Env, error) {
	pg, err := StartPostgres(ctx, LocalFirst)
	if err != nil {
		return nil, err
	}
	kf, err := StartKafka(ctx, false)
	if err != nil {
		_ = pg.Close()
		return nil, err
	}
	pool, err := pgxpool.New(ctx, pg.URL)
	if err != nil {
		_ = kf.Close()
		_ = pg.Close()
		return nil, err
	}
	log.Printf("postgres: %s; kafka: %s %v", pg.Source, kf.Source, kf.Brokers)
	return &Env{Postgres: pg, Kafka: kf, Pool: pool}, nil
}

// Close closes the pool and stops what StartEnv started.
func (e *Env) Close() {
	e.Pool.Close()
	_ = e.Kafka.Close()
	_ = e.Postgres.Close()
}
