package deadletter_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/store/letters"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// setAside writes letters of consumer c as the consumer does.
func setAside(t *testing.T, db *testenv.DB, topic string, partition int, ls ...deadletter.Letter) {
	t.Helper()
	w, err := letters.NewStore(db.Schema)
	require.NoError(t, err)
	b := &pgx.Batch{}
	require.NoError(t, w.QueueInsert(b, "c", topic, partition, ls))
	require.NoError(t, db.Pool.SendBatch(context.Background(), b).Close())
}

func letter(off int64, key, value string) deadletter.Letter {
	now := time.Now()
	return deadletter.Letter{Offset: off, MessageID: key + value, Key: []byte(key), Value: []byte(value),
		Class: deadletter.ClassPermanent, Error: "boom", Attempts: 1, FirstFailedAt: now, LastFailedAt: now}
}

func TestFootprintsAreOffsetAndContent(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := deadletter.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	setAside(t, db, "t", 0, letter(4, "k", "a"), letter(5, "k", "b"), letter(5, "k", "c"), letter(9, "k", "d"))
	setAside(t, db, "t", 1, letter(5, "k", "e"))
	setAside(t, db, "u", 0, letter(5, "k", "f"))

	got, err := s.Footprints(ctx, db.Pool, "c", "t", 0, 5, 9)
	require.NoError(t, err)
	require.ElementsMatch(t, []deadletter.Footprint{
		{Offset: 5, Fingerprint: dedupe.FingerprintOf([]byte("k"), []byte("b"))},
		{Offset: 5, Fingerprint: dedupe.FingerprintOf([]byte("k"), []byte("c"))},
		{Offset: 9, Fingerprint: dedupe.FingerprintOf([]byte("k"), []byte("d"))},
	}, got, "the stored fingerprint is the one dedupe.FingerprintOf computes")
	none, err := s.Footprints(ctx, db.Pool, "other", "t", 0, 0, 100)
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestRequestRedriveMarksPendingLettersOfTheConsumer(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := deadletter.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	setAside(t, db, "t", 0, letter(1, "k", "a"), letter(2, "k", "b"))
	ls, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c"})
	require.NoError(t, err)
	ids := []int64{ls[0].ID, ls[1].ID}

	n, err := s.RequestRedrive(ctx, db.Pool, "other", ids)
	require.NoError(t, err)
	require.Zero(t, n, "letters of another consumer")
	n, err = s.RequestRedrive(ctx, db.Pool, "c", ids[:1])
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	requested, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c", RedriveRequested: true})
	require.NoError(t, err)
	require.Len(t, requested, 1)
	require.Equal(t, ids[0], requested[0].ID)
	got, err := s.Get(ctx, db.Pool, ids[0])
	require.NoError(t, err)
	require.NotNil(t, got.RedriveRequestedAt)

	_, err = s.Get(ctx, db.Pool, 999999)
	require.ErrorIs(t, err, deadletter.ErrNotFound)
}

func TestNewStoreRejectsBadSchemaNames(t *testing.T) {
	t.Parallel()
	_, err := deadletter.NewStore(`bad"name`)
	require.ErrorContains(t, err, "deadletter: schema name must match")
}
