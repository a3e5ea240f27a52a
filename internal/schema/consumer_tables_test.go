package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A migration that adds a table naming its consumer must add it to
// ConsumerTables, or the cleanup that relies on the list leaves its rows.
func TestConsumerTablesAreAllThatNameAConsumer(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	rows, _ := db.Pool.Query(context.Background(), `SELECT table_name::text FROM information_schema.columns
		WHERE table_schema = $1 AND column_name = 'consumer' ORDER BY 1`, db.Schema)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, got, schema.ConsumerTables, "the tables of a migrated schema with a consumer column, against schema.ConsumerTables")
}
