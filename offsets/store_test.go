package offsets_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestResetMovesBackward(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _ := offsets.NewStore(db.Schema)
	advance, _ := positions.NewStore(db.Schema)
	ctx := context.Background()
	require.NoError(t, advance.Advance(ctx, db.Pool, "c", "t", 0, 100))
	require.NoError(t, s.Reset(ctx, db.Pool, "c", "t", 0, 10))
	next, _, err := s.Load(ctx, db.Pool, "c", "t", 0)
	require.NoError(t, err)
	require.EqualValues(t, 10, next)
	require.NoError(t, s.Reset(ctx, db.Pool, "c", "t", 3, 5), "reset creates a missing position")
	require.ErrorContains(t, s.Reset(ctx, db.Pool, "c", "t", 0, -1), "not negative")
}

// ResetFrom moves a position only from the one the caller read: a consumer
// that moved it meanwhile keeps its position.
func TestResetFromRefusesAMovedPosition(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _ := offsets.NewStore(db.Schema)
	advance, _ := positions.NewStore(db.Schema)
	ctx := context.Background()
	require.NoError(t, advance.Advance(ctx, db.Pool, "c", "t", 0, 100))
	require.NoError(t, advance.Advance(ctx, db.Pool, "c", "t", 0, 200)) // the worker, after the read of 100

	err := s.ResetFrom(ctx, db.Pool, "c", "t", 0, 100, 150)
	require.ErrorIs(t, err, offsets.ErrMoved)
	var moved *offsets.MovedError
	require.ErrorAs(t, err, &moved)
	require.EqualValues(t, 200, moved.Now)
	next, _, err := s.Load(ctx, db.Pool, "c", "t", 0)
	require.NoError(t, err)
	require.EqualValues(t, 200, next, "not moved backwards")

	require.NoError(t, s.ResetFrom(ctx, db.Pool, "c", "t", 0, 200, 150), "a deliberate reset from what was read")
	next, _, err = s.Load(ctx, db.Pool, "c", "t", 0)
	require.NoError(t, err)
	require.EqualValues(t, 150, next)

	require.NoError(t, s.ResetFrom(ctx, db.Pool, "c", "t", 1, -1, 5), "from no position")
	require.ErrorIs(t, s.ResetFrom(ctx, db.Pool, "c", "t", 1, -1, 9), offsets.ErrMoved, "a position appeared meanwhile")
}

func TestForgetDeletesTheConsumersPositionsOfATopic(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _ := offsets.NewStore(db.Schema)
	ctx := context.Background()
	for _, p := range []offsets.Position{
		{Consumer: "c", Topic: "t", Partition: 0, Next: 5},
		{Consumer: "c", Topic: "t", Partition: 1, Next: 6},
		{Consumer: "c", Topic: "u", Partition: 0, Next: 7},
		{Consumer: "other", Topic: "t", Partition: 0, Next: 8},
	} {
		require.NoError(t, s.Reset(ctx, db.Pool, p.Consumer, p.Topic, p.Partition, p.Next))
	}

	n, err := s.Forget(ctx, db.Pool, "c", "t")
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	left, err := s.List(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Equal(t, "u", left[0].Topic)
	next, ok, err := s.Load(ctx, db.Pool, "other", "t", 0)
	require.NoError(t, err)
	require.True(t, ok, "another consumer's position stays")
	require.EqualValues(t, 8, next)
	consumers, err := s.Consumers(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{"c", "other"}, consumers)

	n, err = s.Forget(ctx, db.Pool, "c", "t")
	require.NoError(t, err)
	require.Zero(t, n)
}

// TopicRecreated sets the new topic's partitions to 0, deletes the
// positions of partitions it no longer has, and touches no other topic
// or consumer. (Its retirement of position ids is shown end to end in
// consumer's TestATopicRecreatedByTheProcedureIsAppliedAfresh.)
func TestTopicRecreatedStartsTheNewTopicAtZero(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _ := offsets.NewStore(db.Schema)
	advance, _ := positions.NewStore(db.Schema)
	ctx := context.Background()
	for p := range 4 {
		require.NoError(t, advance.Advance(ctx, db.Pool, "c", "t", p, 100))
	}
	require.NoError(t, advance.Advance(ctx, db.Pool, "c", "other", 0, 7))
	require.NoError(t, advance.Advance(ctx, db.Pool, "d", "t", 0, 9))

	res, err := s.TopicRecreated(ctx, db.Pool, "c", "t", 3)
	require.NoError(t, err)
	require.EqualValues(t, 3, res.Positions)
	require.EqualValues(t, 1, res.Dropped)
	ps, err := s.List(ctx, db.Pool, "c")
	require.NoError(t, err)
	got := map[string]int64{}
	for _, p := range ps {
		got[p.Topic+"/"+string(rune('0'+p.Partition))] = p.Next
	}
	require.Equal(t, map[string]int64{"t/0": 0, "t/1": 0, "t/2": 0, "other/0": 7}, got)
	next, _, err := s.Load(ctx, db.Pool, "d", "t", 0)
	require.NoError(t, err)
	require.EqualValues(t, 9, next, "another consumer's position is its own")

	_, err = s.TopicRecreated(ctx, db.Pool, "c", "t", 0)
	require.ErrorContains(t, err, "at least one")
}
