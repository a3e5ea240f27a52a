package claims_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// newStore returns a database of the test's own, migrated, and a Store on
// its tables.
func newStore(tb testing.TB) (*testenv.DB, *claims.Store) {
	tb.Helper()
	db := testenv.NewDB(tb)
	s, err := claims.NewStore(db.Schema)
	require.NoError(tb, err)
	return db, s
}

func newClaims(ids ...string) []claims.Claim {
	out := make([]claims.Claim, len(ids))
	for i, id := range ids {
		out[i] = claims.Claim{MessageID: id, Fingerprint: dedupe.FingerprintOf(nil, []byte(id)), Offset: int64(10 + i)}
	}
	return out
}

func TestClaimInsertsOnlyNewIDs(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()

	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	got, err := s.Claim(ctx, tx, "c", "t", 0, newClaims("a", "b"))
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, got)
	require.NoError(t, tx.Commit(ctx))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	got, err = s.Claim(ctx, tx, "c", "t", 0, newClaims("b", "c", "a"))
	require.NoError(t, err)
	require.Equal(t, []bool{false, true, false}, got)
	// Another consumer name is another scope.
	got, err = s.Claim(ctx, tx, "other", "t", 0, newClaims("a"))
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

func TestRolledBackClaimIsNotAClaim(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = s.Claim(ctx, tx, "c", "t", 0, newClaims("a"))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	tx, err = db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	got, err := s.Claim(ctx, tx, "c", "t", 0, newClaims("a"))
	require.NoError(t, err)
	require.Equal(t, []bool{true}, got)
}

func TestConcurrentClaimWaitsForTheFirstTransaction(t *testing.T) {
	t.Parallel()
	db, s := newStore(t)
	ctx := context.Background()

	first, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	got, err := s.Claim(ctx, first, "c", "t", 0, newClaims("a", "b"))
	require.NoError(t, err)
	require.Equal(t, []bool{true, true}, got)

	second := make(chan []bool, 1)
	go func() {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		defer tx.Rollback(ctx)
		got, err := s.Claim(ctx, tx, "c", "t", 1, newClaims("b", "a", "x"))
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
