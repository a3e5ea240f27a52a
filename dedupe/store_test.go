package dedupe_test

import (
	"context"
	"testing"
	"time"

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

func claims(ids ...string) []dedupe.Claim {
	out := make([]dedupe.Claim, len(ids))
	for i, id := range ids {
		out[i] = dedupe.Claim{MessageID: id, Fingerprint: dedupe.FingerprintOf(nil, []byte(id)), Offset: int64(10 + i)}
	}
	return out
}

func TestClaimInsertsOnlyNewIDs(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	got, err := s.Claim(ctx, tx, "c", "t", 0, claims("a", "b"))
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, got)
	require.NoError(t, tx.Commit(ctx))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	got, err = s.Claim(ctx, tx, "c", "t", 0, claims("b", "c", "a"))
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, false}, got)
	// Another consumer name is another scope.
	got, err = s.Claim(ctx, tx, "other", "t", 0, claims("a"))
	require.NoError(t, err)
	require.Equal(t, []bool{true}, got)
	require.NoError(t, tx.Commit(ctx))

	recs, err := s.Lookup(ctx, db.Pool, "c", []string{"a", "b", "c", "zzz"})
	require.NoError(t, err)
	require.Len(t, recs, 3)
	require.Equal(t, dedupe.StatusApplied, recs["a"].Status)
	require.Equal(t, dedupe.FingerprintOf(nil, []byte("a")), recs["a"].Fingerprint)
	require.EqualValues(t, 10, recs["a"].Offset, "the first claim's position is kept")
	require.Equal(t, "t", recs["c"].Topic)
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

func TestRolledBackClaimIsNotAClaim(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = s.Claim(ctx, tx, "c", "t", 0, claims("a"))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	got, err := s.Claim(ctx, tx, "c", "t", 0, claims("a"))
	require.NoError(t, err)
	require.Equal(t, []bool{true}, got)
}

func TestConcurrentClaimWaitsForTheFirstTransaction(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()

	first, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	got, err := s.Claim(ctx, first, "c", "t", 0, claims("a", "b"))
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, got)

	second := make(chan []bool, 1)
	go func() {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback(ctx)
		got, err := s.Claim(ctx, tx, "c", "t", 1, claims("b", "a", "x"))
		if err != nil {
			panic(err)
		}
		second <- got
	}()
	select {
	case <-second:
		t.Fatal("the second claim did not wait for the first transaction")
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, first.Commit(ctx))
	require.Equal(t, []bool{false, false, true}, <-second, "after the first commits, its ids are taken")
}

func TestNewStoreRejectsBadSchemaNames(t *testing.T) {
	t.Parallel()
	_, err := dedupe.NewStore(`bad"name`)
	require.ErrorContains(t, err, "dedupe: schema name must match")
}
