package attempts_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func setup(t *testing.T) (*testenv.DB, *attempts.Store) {
	t.Helper()
	db := testenv.NewDB(t)
	s, err := attempts.NewStore(db.Schema)
	require.NoError(t, err)
	return db, s
}

// A member expelled from the group (a zombie) may still be finishing its
// run when the new owner's run starts, at the same offset when the zombie
// got nowhere. The zombie's clean end must not clear the new owner's
// record: if the new owner then dies too, the next run must see two starts
// at that offset and go one message at a time.
func TestAZombieRunEndingDoesNotClearTheNewOwnersRun(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()

	zombie, starts, _, _, err := s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	require.Equal(t, 1, starts)
	owner, starts, _, _, err := s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	require.Equal(t, 2, starts, "the zombie's run had not ended")
	require.NotEqual(t, zombie, owner, "each run has an identity of its own")

	require.NoError(t, s.Ended(ctx, db.Pool, "c", "t", 0, zombie))
	// The owner dies without ending; the next run starts at the same offset.
	_, starts, _, _, err = s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	require.Equal(t, 3, starts, "the zombie's end must leave the owner's record alone")
}

func TestARunThatEndsCleanlyIsNotCountedAsAStart(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()

	run, starts, _, _, err := s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	require.Equal(t, 1, starts)
	require.NoError(t, s.Ended(ctx, db.Pool, "c", "t", 0, run))
	_, starts, _, _, err = s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	require.Equal(t, 1, starts, "the previous run ended cleanly")
	_, starts, _, _, err = s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	require.Equal(t, 2, starts, "the previous run did not end")
	_, starts, _, _, err = s.Assigned(ctx, db.Pool, "c", "t", 0, 11)
	require.NoError(t, err)
	require.Equal(t, 1, starts, "a run that starts further on made progress")
}

// After a topic is deleted and re-created and its positions are reset, a
// row left at an offset by a message of the old topic must not count the
// attempts of the new message at that offset.
func TestAttemptsOfAnotherMessageAtTheSameOffsetStartOver(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()
	k := attempts.Key{Consumer: "c", Topic: "t", Partition: 0, Offset: 5}

	rec, err := s.Begin(ctx, db.Pool, k, "old", 1)
	require.NoError(t, err)
	oldFirst := rec.FirstAttemptAt
	require.NoError(t, s.Fail(ctx, db.Pool, k, "retries_exhausted", "old failure"))
	rec, err = s.Begin(ctx, db.Pool, k, "old", 1)
	require.NoError(t, err)
	require.Equal(t, 2, rec.Attempts)
	require.True(t, rec.PreviousErrored)
	require.Equal(t, "old failure", rec.LastError)

	rec, err = s.Begin(ctx, db.Pool, k, "new", 1)
	require.NoError(t, err)
	require.Equal(t, 1, rec.Attempts, "the old message's attempts are not the new one's")
	require.Empty(t, rec.LastError)
	require.Empty(t, rec.LastErrorClass)
	require.False(t, rec.PreviousErrored)
	require.True(t, rec.FirstAttemptAt.After(oldFirst), "the new message's first attempt is now")

	rec, err = s.Begin(ctx, db.Pool, k, "new", 1)
	require.NoError(t, err)
	require.Equal(t, 2, rec.Attempts, "the new message's own attempts are counted")

	rec, err = s.Begin(ctx, db.Pool, attempts.Key{Consumer: "c", Topic: "t", Partition: 0, Offset: 6}, "other", 2)
	require.NoError(t, err)
	require.Equal(t, 2, rec.Attempts, "a first record starts at initial")
}

// A stop is recorded on the run that stopped, or, before any run was
// recorded, on a record of its own that does not count as a start; the
// next assignment clears it. A zombie's run cannot mark the new owner's.
func TestAStopIsRecordedUntilTheNextAssignment(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()

	require.NoError(t, s.Stopped(ctx, db.Pool, "c", "t", 0, 0, "position ahead of the log\x00"))
	stops, err := s.Stops(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Len(t, stops, 1)
	require.Equal(t, "position ahead of the log\uFFFD", stops[0].Reason)
	_, starts, _, _, err := s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	require.Equal(t, 1, starts, "a stop before the run is no start")
	stops, err = s.Stops(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Empty(t, stops)

	owner, _, _, _, err := s.Assigned(ctx, db.Pool, "c", "t", 0, 10)
	require.NoError(t, err)
	require.NoError(t, s.Stopped(ctx, db.Pool, "c", "t", 0, owner-1, "a zombie's"))
	stops, err = s.Stops(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Empty(t, stops, "another run's stop leaves the owner's record alone")
	require.NoError(t, s.Stopped(ctx, db.Pool, "c", "t", 0, owner, strings.Repeat("é", 3000)))
	stops, err = s.Stops(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Len(t, stops, 1)
	require.True(t, strings.HasSuffix(stops[0].Reason, "... [truncated]"))
}

// A reason of invalid UTF-8, NUL bytes and 1 MiB is stored, cut
// to valid UTF-8, and does not fail the record (S7).
func TestAStopReasonOfInvalidBytesIsStored(t *testing.T) {
	t.Parallel()
	db, s := setup(t)
	ctx := context.Background()
	reason := "bad \xff\xfe\x00 " + strings.Repeat("\xc3", 1<<20) // 1 MiB of cut-off 2-byte sequences
	require.NoError(t, s.Stopped(ctx, db.Pool, "c", "t", 0, 0, reason))
	stops, err := s.Stops(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Len(t, stops, 1)
	require.True(t, utf8.ValidString(stops[0].Reason))
	require.Less(t, len(stops[0].Reason), 16<<10)
	require.True(t, strings.HasPrefix(stops[0].Reason, "bad \uFFFD"))
	// A cancelled context fails fast, and leaves nothing half-written.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, s.Stopped(cctx, db.Pool, "c", "t", 1, 0, "x"))
}
