package attempts_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/attempts"
)

// A run that takes over the partition's record starts with a fresh pace:
// kafkaonce status must not show the previous run's batch size and
// retries for a run that never lost a race.
func TestANewRunStartsWithAFreshPace(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()

	old, _, _, _, err := s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	b := &pgx.Batch{}
	s.QueuePace(b, "c", "t", 0, attemptsPace(old))
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())

	current, _, _, _, err := s.Assigned(ctx, db.Pool, "c", "t", 0, 500)
	require.NoError(t, err)
	paces, err := s.Paces(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Len(t, paces, 1)
	p := paces[0]
	require.Equal(t, current, p.Run)
	t.Logf("new run %d shows: adapted=%v batch_limit=%d contention_retries=%d serialized_until=%v",
		p.Run, p.Adapted, p.BatchLimit, p.ContentionRetries, p.SerializedUntil)
	require.False(t, p.Adapted, "the new run never met contention: its batches are MaxBatch")
	require.Zero(t, p.ContentionRetries, "the new run lost no race")
}

func attemptsPace(run int64) attempts.Pace {
	return attempts.Pace{Run: run, BatchLimit: 1, ContentionRetries: 42, LastContention: time.Now(), SerializedUntil: time.Now().Add(4 * time.Minute)}
}
