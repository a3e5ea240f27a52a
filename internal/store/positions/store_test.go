package positions_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestAdvanceOnlyMovesForward(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := positions.NewStore(db.Schema)
	require.NoError(t, err)
	read, err := offsets.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()

	_, ok, err := read.Load(ctx, db.Pool, "c", "t", 0)
	require.NoError(t, err)
	require.False(t, ok)

	require.NoError(t, s.Advance(ctx, db.Pool, "c", "t", 0, 100))
	require.NoError(t, s.Advance(ctx, db.Pool, "c", "t", 0, 40)) // a zombie's late batch
	next, ok, err := read.Load(ctx, db.Pool, "c", "t", 0)
	require.NoError(t, err)
	require.True(t, ok)
	require.EqualValues(t, 100, next)

	require.NoError(t, s.Advance(ctx, db.Pool, "c", "t", 0, 150))
	require.NoError(t, s.Advance(ctx, db.Pool, "c", "t", 1, 7))
	require.NoError(t, s.Advance(ctx, db.Pool, "other", "t", 0, 1))
	ps, err := read.List(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Len(t, ps, 2)
	require.Equal(t, "t", ps[0].Topic)
	require.EqualValues(t, 150, ps[0].Next)
	require.Equal(t, 1, ps[1].Partition)
	require.EqualValues(t, 7, ps[1].Next)

	require.ErrorContains(t, s.Advance(ctx, db.Pool, "c", "t", 0, -1), "not negative")
}

// QueueInit stores a first start only where there is no position, and
// reads back the position that stands.
func TestInitStoresTheFirstStartOnly(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := positions.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	initAt := func(start int64) int64 {
		var next int64
		b := &pgx.Batch{}
		s.QueueInit(b, "c", "t", 0, start, &next)
		require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
		return next
	}
	require.EqualValues(t, 12, initAt(12), "no position: the start is stored")
	require.EqualValues(t, 12, initAt(40), "a position stands: a later start (the log moved on) does not replace it")
	require.EqualValues(t, 12, initAt(3), "nor an earlier one")
	require.NoError(t, s.Advance(ctx, db.Pool, "c", "t", 0, 20))
	require.EqualValues(t, 20, initAt(0))
}
