package letters_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/store/letters"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestInsertListAndMark(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := letters.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	letter := func(off int64, id string, class deadletter.Class) deadletter.Letter {
		return deadletter.Letter{Offset: off, MessageID: id, Key: []byte("k"), Value: []byte{0, 1, 2},
			Headers: []deadletter.Header{{Key: "h", Value: []byte{0xff}}}, Class: class, Error: "boom",
			Attempts: 2, FirstFailedAt: now, LastFailedAt: now}
	}
	b := &pgx.Batch{}
	require.NoError(t, s.QueueInsert(b, "c", "t", 0, []deadletter.Letter{
		letter(1, "a", deadletter.ClassPermanent), letter(2, "", deadletter.ClassInvalidID),
	}))
	require.NoError(t, s.QueueInsert(b, "c", "t", 1, []deadletter.Letter{letter(5, "b", deadletter.ClassPanic)}))
	require.NoError(t, s.QueueInsert(b, "other", "t", 0, []deadletter.Letter{letter(1, "a", deadletter.ClassPermanent)}))
	// The same message twice: the first letter stands.
	require.NoError(t, s.QueueInsert(b, "c", "t", 0, []deadletter.Letter{letter(1, "a", deadletter.ClassCrashed)}))
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())

	all, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c"})
	require.NoError(t, err)
	require.Len(t, all, 3)
	require.Equal(t, deadletter.ClassPermanent, all[0].Class)
	require.Equal(t, []byte{0, 1, 2}, all[0].Value)
	require.Equal(t, []deadletter.Header{{Key: "h", Value: []byte{0xff}}}, all[0].Headers)
	require.Equal(t, now, all[0].FirstFailedAt.UTC())
	require.Empty(t, all[1].MessageID, "a letter without an id")

	p0, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c", Topic: "t", Partition: 0, HasPartition: true})
	require.NoError(t, err)
	require.Len(t, p0, 2)
	byClass, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c", Class: deadletter.ClassPanic})
	require.NoError(t, err)
	require.Len(t, byClass, 1)
	page, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c", AfterID: all[0].ID, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, all[1].ID, page[0].ID)

	require.NoError(t, s.MarkRedriven(ctx, db.Pool, all[0].ID))
	require.NoError(t, s.MarkPublished(ctx, db.Pool, []int64{all[1].ID}))
	pending, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c", Pending: true})
	require.NoError(t, err)
	require.Len(t, pending, 2)
	unpublished, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c", Unpublished: true})
	require.NoError(t, err)
	require.Len(t, unpublished, 2)
	counts, err := s.Count(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Equal(t, deadletter.Counts{Letters: 3, Open: 2}, counts)

	got, err := s.Get(ctx, db.Pool, all[0].ID)
	require.NoError(t, err)
	require.NotNil(t, got.RedrivenAt)
	_, err = s.Get(ctx, db.Pool, 999999)
	require.ErrorIs(t, err, deadletter.ErrNotFound)
}

// Messages set aside to be retried later are counted apart from dead
// letters: waiting while their retries are to come, applied once one
// succeeds; one whose retries ran out is a dead letter.
func TestCountsTellRetriesFromDeadLetters(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := letters.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	letter := func(off int64, class deadletter.Class, retryIn time.Duration) deadletter.Letter {
		l := deadletter.Letter{Offset: off, MessageID: "m" + string(rune('a'+off)), Value: []byte("v"), Class: class, Error: "partner down",
			Attempts: 1, FirstFailedAt: now, LastFailedAt: now}
		if retryIn > 0 {
			at := now.Add(retryIn)
			l.RetryAt = &at
		}
		return l
	}
	b := &pgx.Batch{}
	require.NoError(t, s.QueueInsert(b, "c", "t", 0, []deadletter.Letter{
		letter(0, deadletter.ClassRetryLater, time.Hour),
		letter(1, deadletter.ClassRetryLater, time.Minute),
		letter(2, deadletter.ClassRetryLater, 2*time.Minute),
		letter(3, deadletter.ClassPermanent, 0),
	}))
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	all, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c"})
	require.NoError(t, err)
	require.Len(t, all, 4)

	counts, err := s.Count(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Equal(t, deadletter.Counts{Letters: 1, Open: 1, Waiting: 3, NextRetry: now.Add(time.Minute)}, normalized(counts))
	n, next, err := s.Waiting(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.EqualValues(t, 3, n)
	require.Equal(t, now.Add(time.Minute), next.UTC())

	// A retry applies the first due; the next one's retries run out.
	require.NoError(t, s.MarkRedriven(ctx, db.Pool, all[1].ID))
	recorded, err := s.RetryFailed(ctx, db.Pool, all[2].ID, 0, nil, deadletter.ClassRetriesExhausted, "still down")
	require.NoError(t, err)
	require.True(t, recorded)
	counts, err = s.Count(ctx, db.Pool, "c")
	require.NoError(t, err)
	require.Equal(t, deadletter.Counts{Letters: 2, Open: 2, Waiting: 1, NextRetry: now.Add(time.Hour), AppliedOnRetry: 1}, normalized(counts))

	byClass, err := s.CountByClass(ctx, db.Pool)
	require.NoError(t, err)
	require.Contains(t, byClass, deadletter.ClassCount{Consumer: "c", Class: deadletter.ClassRetryLater, Total: 2, Pending: 1, Waiting: 1})
	require.Contains(t, byClass, deadletter.ClassCount{Consumer: "c", Class: deadletter.ClassRetriesExhausted, Total: 1, Pending: 1})

	none, err := s.Count(ctx, db.Pool, "nobody")
	require.NoError(t, err)
	require.Equal(t, deadletter.Counts{}, none)
}

// normalized puts c's time in UTC, for comparison.
func normalized(c deadletter.Counts) deadletter.Counts {
	if !c.NextRetry.IsZero() {
		c.NextRetry = c.NextRetry.UTC()
	}
	return c
}

func TestLongErrorsAreCut(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, _ := letters.NewStore(db.Schema)
	ctx := context.Background()
	b := &pgx.Batch{}
	long := strings.Repeat("é", deadletter.MaxErrorLen) // 2 bytes each
	require.NoError(t, s.QueueInsert(b, "c", "t", 0, []deadletter.Letter{{Offset: 1, Class: deadletter.ClassPanic, Error: long,
		FirstFailedAt: time.Now(), LastFailedAt: time.Now()}}))
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	ls, err := s.List(ctx, db.Pool, deadletter.Filter{})
	require.NoError(t, err)
	require.LessOrEqual(t, len(ls[0].Error), deadletter.MaxErrorLen+len("... [truncated]"))
	require.True(t, strings.HasSuffix(ls[0].Error, "... [truncated]"))
}

// After a topic is deleted and re-created and its positions are reset, a
// new message can come at the offset of an old letter. It must get a letter
// of its own: inserting it must not be taken for a repeat of the old one,
// or the position would move past a message neither applied nor set aside.
// The same message set aside twice (a batch run again after an unknown
// COMMIT outcome) still gives one letter, with or without an id.
func TestAnotherMessageAtTheOffsetOfALetterGetsALetterOfItsOwn(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := letters.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	then := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	letter := func(id, key, value string, at time.Time) deadletter.Letter {
		return deadletter.Letter{Offset: 7, MessageID: id, Key: []byte(key), Value: []byte(value), MessageTime: at,
			Class: deadletter.ClassPermanent, Error: "boom", Attempts: 1, FirstFailedAt: then, LastFailedAt: then}
	}
	insert := func(ls ...deadletter.Letter) {
		t.Helper()
		b := &pgx.Batch{}
		require.NoError(t, s.QueueInsert(b, "c", "t", 0, ls))
		require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	}
	count := func() int {
		t.Helper()
		ls, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c"})
		require.NoError(t, err)
		return len(ls)
	}

	insert(letter("a", "k", "old", then), letter("", "k", "old", then))
	require.Equal(t, 2, count())
	insert(letter("a", "k", "old", then), letter("", "k", "old", then))
	require.Equal(t, 2, count(), "the same messages set aside again")

	for _, l := range []deadletter.Letter{
		letter("b", "k", "old", then),                      // another id
		letter("a", "k", "new", then),                      // other content
		letter("a", "k2", "old", then),                     // another key
		letter("", "k", "new", then),                       // no id, other content
		letter("", "k", "old", then.Add(time.Millisecond)), // no id, same content, written at another time
		letter("", "", "kold", then),                       // the same bytes split differently
		letter("", "k", "old", time.Time{}),                // no timestamp
	} {
		before := count()
		insert(l)
		require.Equal(t, before+1, count(), "letter %+v", l)
	}
	insert(letter("", "k", "old", time.Time{}))
	require.Equal(t, 9, count(), "the same message without a timestamp set aside again")
}

// GetForUpdate holds the letter until its transaction ends: a second
// redrive of the letter waits, then reads what the first one recorded.
func TestGetForUpdateLocksTheLetter(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := letters.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	b := &pgx.Batch{}
	require.NoError(t, s.QueueInsert(b, "c", "t", 0, []deadletter.Letter{{Offset: 3, MessageID: "a", Class: deadletter.ClassPanic,
		FirstFailedAt: time.Now(), LastFailedAt: time.Now()}}))
	require.NoError(t, db.Pool.SendBatch(ctx, b).Close())
	ls, err := s.List(ctx, db.Pool, deadletter.Filter{Consumer: "c"})
	require.NoError(t, err)
	id := ls[0].ID

	first, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = first.Rollback(ctx) }()
	l, err := s.GetForUpdate(ctx, first, "c", id)
	require.NoError(t, err)
	require.Equal(t, "a", l.MessageID)
	require.Nil(t, l.RedrivenAt)

	second := make(chan deadletter.Letter, 1)
	go func() {
		var l deadletter.Letter
		_ = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) (err error) {
			l, err = s.GetForUpdate(ctx, tx, "c", id)
			return err
		})
		second <- l
	}()
	require.Eventually(t, func() bool { return db.Sessions(t, "active") > 0 }, 5*time.Second, 10*time.Millisecond, "the second reader waits for the lock")
	require.NoError(t, s.MarkRedriven(ctx, first, id))
	require.NoError(t, first.Commit(ctx))
	require.NotNil(t, (<-second).RedrivenAt, "the second reader sees the first one's redrive")

	err = pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := s.GetForUpdate(ctx, tx, "other", id)
		return err
	})
	require.ErrorIs(t, err, deadletter.ErrNotFound, "a letter of another consumer")
}
