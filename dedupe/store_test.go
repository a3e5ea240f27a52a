package dedupe_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newStore returns a database of the test's own, migrated, and a Store on
// its tables.
func newStore(tb testing.TB) (*testenv.DB, *dedupe.Store) {
	tb.Helper()
	db := testenv.NewDB(tb)
	s, err := dedupe.NewStore(db.Schema)
	require.NoError(tb, err)
	return db, s
}

// Lookup must not run as a cached prepared statement: the generic plan
// Postgres settles on for one made while the table was small filters
// message_id instead of seeking it (an index scan on consumer alone), which
// read every row of the consumer on each lookup once the table had grown:
// a benchmark's duplicate-heavy batches slowed down threefold within a run.
func TestLookupIsNotACachedPreparedStatement(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for range 10 { // past the five custom plans after which Postgres may go generic
		_, err := s.Lookup(ctx, conn, "c", []string{"a", "b"})
		require.NoError(t, err)
	}
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE strpos(statement, $1) > 0`,
		"message_id = ANY").Scan(&n))
	require.Zero(t, n, "the lookup was prepared on the connection")
}

func TestNewStoreRejectsBadSchemaNames(t *testing.T) {
	t.Parallel()
	_, err := dedupe.NewStore(`bad"name`)
	require.ErrorContains(t, err, "dedupe: schema name must match")
}
