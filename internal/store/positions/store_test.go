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
		s.QueueInit(b, "c", "t", 0, start, [16]byte{1}, &next)
		require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
		return next
	}
	require.EqualValues(t, 12, initAt(12), "no position: the start is stored")
	require.EqualValues(t, 12, initAt(40), "a position stands: a later start (the log moved on) does not replace it")
	require.EqualValues(t, 12, initAt(3), "nor an earlier one")
	require.NoError(t, s.Advance(ctx, db.Pool, "c", "t", 0, 20))
	require.EqualValues(t, 20, initAt(0))
}

// The topic id kept with a position: stored with a first start, taken by a
// position that has none, never replaced by another, and cleared when an
// operator moves the position.
func TestTopicIDStaysWithItsPosition(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := positions.NewStore(db.Schema)
	require.NoError(t, err)
	read, err := offsets.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	run := func(queue func(b *pgx.Batch)) {
		t.Helper()
		b := &pgx.Batch{}
		queue(b)
		require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	}
	stored := func(partition int) positions.Stored {
		t.Helper()
		var st positions.Stored
		run(func(b *pgx.Batch) { s.QueueLoadStored(b, "c", "t", partition, &st) })
		return st
	}
	old, recreated := [16]byte{1, 2, 3}, [16]byte{9, 8, 7}

	t.Run("a first start stores the topic's id with it", func(t *testing.T) {
		var next int64
		run(func(b *pgx.Batch) { s.QueueInit(b, "c", "t", 0, 5, old, &next) })
		st := stored(0)
		require.True(t, st.Found)
		require.True(t, st.TopicID.Valid)
		require.Equal(t, old, st.TopicID.Bytes)
	})
	t.Run("a stored id is never replaced by the id a member found", func(t *testing.T) {
		run(func(b *pgx.Batch) { s.QueueAdoptTopic(b, "c", "t", 0, recreated) })
		require.Equal(t, old, stored(0).TopicID.Bytes)
	})
	t.Run("a position without an id takes the one a member found", func(t *testing.T) {
		require.NoError(t, s.Advance(ctx, db.Pool, "c", "t", 1, 7))
		require.False(t, stored(1).TopicID.Valid, "a position stored by a batch's advance carries no id")
		run(func(b *pgx.Batch) { s.QueueAdoptTopic(b, "c", "t", 1, recreated) })
		require.Equal(t, recreated, stored(1).TopicID.Bytes)
	})
	t.Run("the zero id is none", func(t *testing.T) {
		var next int64
		run(func(b *pgx.Batch) { s.QueueInit(b, "c", "t", 2, 0, [16]byte{}, &next) })
		require.False(t, stored(2).TopicID.Valid)
	})
	t.Run("an operator's move keeps the id; an acknowledged re-creation clears it", func(t *testing.T) {
		require.NoError(t, read.Reset(ctx, db.Pool, "c", "t", 0, 0))
		require.Equal(t, old, stored(0).TopicID.Bytes, "Reset moves the position within its topic")
		require.NoError(t, read.ResetFrom(ctx, db.Pool, "c", "t", 0, 0, 3))
		require.Equal(t, old, stored(0).TopicID.Bytes, "ResetFrom too")
		_, err := read.TopicRecreated(ctx, db.Pool, "c", "t", 2)
		require.NoError(t, err)
		require.False(t, stored(0).TopicID.Valid, "TopicRecreated clears it: the next member stores the new topic's")
		require.False(t, stored(1).TopicID.Valid)
	})
}
