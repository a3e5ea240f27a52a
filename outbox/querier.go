package outbox

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Querier runs the operator functions' statements (Parked, Retry,
// Pending): *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx all satisfy
// it, so a call runs on its own or inside a transaction of the caller's.
type Querier = kafkaoncetype.Querier

// DB is where the relay runs its transactions: *pgxpool.Pool satisfies it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}
