package offsets

import "github.com/kafkaonce/kafkaonce/kafkaoncetype"

// Querier runs the Store's statements: *pgxpool.Pool, *pgxpool.Conn,
// *pgx.Conn and pgx.Tx all satisfy it, so a call runs on its own or inside
// a transaction of the caller's.
type Querier = kafkaoncetype.Querier
