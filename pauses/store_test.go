package pauses_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/pauses"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestStore(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := pauses.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()

	t.Run("a pause is listed until it is resumed, and the first one stands", func(t *testing.T) {
		paused, err := s.Pause(ctx, db.Pool, "a", pauses.Partition("payments", 3), "ops", "partner down")
		require.NoError(t, err)
		require.True(t, paused)
		paused, err = s.Pause(ctx, db.Pool, "a", pauses.Partition("payments", 3), "someone else", "another reason")
		require.NoError(t, err)
		require.False(t, paused, "paused twice")
		list, err := s.List(ctx, db.Pool, "a")
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, "payments/3", list[0].Scope.String())
		require.Equal(t, "ops", list[0].By)
		require.Equal(t, "partner down", list[0].Reason)
		require.False(t, list[0].At.IsZero())

		resumed, err := s.Resume(ctx, db.Pool, "a", pauses.Partition("payments", 3))
		require.NoError(t, err)
		require.True(t, resumed)
		resumed, err = s.Resume(ctx, db.Pool, "a", pauses.Partition("payments", 3))
		require.NoError(t, err)
		require.False(t, resumed, "resumed what was not paused")
		list, err = s.List(ctx, db.Pool, "a")
		require.NoError(t, err)
		require.Empty(t, list)
	})

	t.Run("each scope covers what it names, and a wider pause outlives a narrower resume", func(t *testing.T) {
		for _, scope := range []pauses.Scope{pauses.All(), pauses.Topic("orders"), pauses.Partition("orders", 1)} {
			_, err := s.Pause(ctx, db.Pool, "b", scope, "ops", "")
			require.NoError(t, err)
		}
		list, err := s.List(ctx, db.Pool, "b")
		require.NoError(t, err)
		require.Equal(t, []string{"every topic", "topic orders", "orders/1"}, scopes(list), "widest first")

		_, err = s.Resume(ctx, db.Pool, "b", pauses.All())
		require.NoError(t, err)
		list, err = s.List(ctx, db.Pool, "b")
		require.NoError(t, err)
		p, ok := pauses.Covering(list, "orders", 7)
		require.True(t, ok)
		require.Equal(t, "topic orders", p.Scope.String(), "the topic's pause covers its partitions")
		_, ok = pauses.Covering(list, "payments", 0)
		require.False(t, ok, "a topic's pause covers no other topic")

		_, err = s.Resume(ctx, db.Pool, "b", pauses.Partition("orders", 1))
		require.NoError(t, err)
		list, err = s.List(ctx, db.Pool, "b")
		require.NoError(t, err)
		_, ok = pauses.Covering(list, "orders", 1)
		require.True(t, ok, "resuming the partition leaves its topic's pause")

		other, err := s.List(ctx, db.Pool, "a")
		require.NoError(t, err)
		require.Empty(t, other, "another consumer's pauses")
	})

	t.Run("text Postgres refuses is cleaned, and long text cut", func(t *testing.T) {
		_, err := s.Pause(ctx, db.Pool, "c", pauses.Topic("t"), "ops\x00\xff", strings.Repeat("r", 5000))
		require.NoError(t, err)
		list, err := s.List(ctx, db.Pool, "c")
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, "ops\uFFFD\uFFFD", list[0].By)
		require.LessOrEqual(t, len(list[0].Reason), pauses.MaxText)
	})

	t.Run("a pause for a time ends by itself, by the server's clock", func(t *testing.T) {
		scope := pauses.Topic("emails")
		paused, err := s.PauseFor(ctx, db.Pool, "d", scope, time.Hour, "ops", "partner window")
		require.NoError(t, err)
		require.True(t, paused)
		list, err := s.List(ctx, db.Pool, "d")
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.InDelta(t, time.Hour.Seconds(), list[0].Until.Sub(list[0].At).Seconds(), 1, "ends an hour after it began")

		paused, err = s.PauseFor(ctx, db.Pool, "d", scope, time.Minute, "someone else", "shorter")
		require.NoError(t, err)
		require.False(t, paused)
		again, err := s.List(ctx, db.Pool, "d")
		require.NoError(t, err)
		require.Equal(t, list, again, "a shorter pause neither shortens the one that holds nor replaces its reason")

		_, err = s.PauseFor(ctx, db.Pool, "d", scope, 2*time.Hour, "someone else", "longer")
		require.NoError(t, err)
		longer, err := s.List(ctx, db.Pool, "d")
		require.NoError(t, err)
		require.True(t, longer[0].Until.After(list[0].Until), "a longer pause lengthens it")
		require.Equal(t, "partner window", longer[0].Reason, "the first pause's reason stands")

		_, err = s.Pause(ctx, db.Pool, "d", scope, "someone else", "hold it")
		require.NoError(t, err)
		held, err := s.List(ctx, db.Pool, "d")
		require.NoError(t, err)
		require.True(t, held[0].Until.IsZero(), "a pause until resumed makes it last until resumed")

		_, err = s.PauseFor(ctx, db.Pool, "d", scope, time.Minute, "someone else", "")
		require.NoError(t, err)
		still, err := s.List(ctx, db.Pool, "d")
		require.NoError(t, err)
		require.True(t, still[0].Until.IsZero(), "and a pause for a time does not give it an end")
	})

	t.Run("a pause past its end is lifted: not listed, not resumed, replaced by the next", func(t *testing.T) {
		scope := pauses.Partition("emails", 2)
		_, err := s.PauseFor(ctx, db.Pool, "e", scope, 100*time.Millisecond, "ops", "short")
		require.NoError(t, err)
		waitListed(t, s, db, "e", 0)

		resumed, err := s.Resume(ctx, db.Pool, "e", scope)
		require.NoError(t, err)
		require.False(t, resumed, "resumed a pause that had ended")

		_, err = s.PauseFor(ctx, db.Pool, "e", scope, 100*time.Millisecond, "ops", "short")
		require.NoError(t, err)
		waitListed(t, s, db, "e", 0)
		paused, err := s.Pause(ctx, db.Pool, "e", scope, "oncall", "for good")
		require.NoError(t, err)
		require.True(t, paused, "a pause over one that ended is a new pause")
		list, err := s.List(ctx, db.Pool, "e")
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, "oncall", list[0].By)
		require.Equal(t, "for good", list[0].Reason)
		require.True(t, list[0].Until.IsZero())
	})

	t.Run("a scope paused earlier in the same transaction is paused already", func(t *testing.T) {
		for _, second := range []func(q pauses.Querier) (bool, error){
			func(q pauses.Querier) (bool, error) {
				return s.Pause(ctx, q, "g", pauses.Topic("emails"), "someone else", "again")
			},
			func(q pauses.Querier) (bool, error) {
				return s.PauseFor(ctx, q, "g", pauses.Topic("emails"), time.Hour, "someone else", "again")
			},
		} {
			tx, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			paused, err := s.Pause(ctx, tx, "g", pauses.Topic("emails"), "ops", "first")
			require.NoError(t, err)
			require.True(t, paused)
			paused, err = second(tx)
			require.NoError(t, err)
			require.False(t, paused, "the first statement of the transaction paused it")
			require.NoError(t, tx.Rollback(ctx))
		}
	})

	t.Run("Count counts the pauses that hold, by consumer", func(t *testing.T) {
		_, err := s.Pause(ctx, db.Pool, "h", pauses.Topic("a"), "", "")
		require.NoError(t, err)
		_, err = s.PauseFor(ctx, db.Pool, "h", pauses.Topic("b"), time.Hour, "", "")
		require.NoError(t, err)
		_, err = s.PauseFor(ctx, db.Pool, "h", pauses.Topic("c"), 50*time.Millisecond, "", "")
		require.NoError(t, err)
		waitListed(t, s, db, "h", 2)
		counts, err := s.Count(ctx, db.Pool)
		require.NoError(t, err)
		require.Equal(t, 2, counts["h"], "the pause that ended is not counted")
		require.NotContains(t, counts, "nobody")
	})

	t.Run("a pause for no time is refused, saying what to use", func(t *testing.T) {
		for _, d := range []time.Duration{0, -time.Minute, time.Nanosecond} {
			_, err := s.PauseFor(ctx, db.Pool, "f", pauses.All(), d, "", "")
			require.ErrorContains(t, err, "use Pause for a pause until resumed")
		}
		list, err := s.List(ctx, db.Pool, "f")
		require.NoError(t, err)
		require.Empty(t, list)
	})

	t.Run("a scope or a name that cannot be right is refused, saying why", func(t *testing.T) {
		for _, c := range []struct {
			consumer string
			scope    pauses.Scope
			want     string
		}{
			{"", pauses.All(), "consumer name is empty"},
			{"a\x00", pauses.All(), "not valid UTF-8 or holds a NUL byte"},
			{"a", pauses.Partition("", 3), "a partition needs its topic"},
			{"a", pauses.Partition("t", -1), "partition -1 is negative"},
			{"a", pauses.Topic("t\xff"), `topic "t\xff" is not valid UTF-8`},
		} {
			_, err := s.Pause(ctx, db.Pool, c.consumer, c.scope, "", "")
			require.ErrorContains(t, err, c.want)
			_, err = s.Resume(ctx, db.Pool, c.consumer, c.scope)
			require.ErrorContains(t, err, c.want)
		}
		_, err := pauses.NewStore("bad name")
		require.Error(t, err)
	})
}

// waitListed waits until consumer lists n pauses.
func waitListed(t *testing.T, s *pauses.Store, db *testenv.DB, consumer string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		list, err := s.List(context.Background(), db.Pool, consumer)
		return err == nil && len(list) == n
	}, 10*time.Second, 20*time.Millisecond, "consumer %s does not list %d pauses", consumer, n)
}

func scopes(ps []pauses.Pause) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Scope.String())
	}
	return out
}

// A pause past its end, by the database server's clock, is lifted: it is
// replaced by the next pause (which reports true and carries its own
// author and reason), and Resume reports false for it. That holds when the
// caller pauses in a transaction of its own (the Querier the Store takes),
// however long that transaction has been open: the statement stamps the
// row with clock_timestamp(), so the pause's end is on the real clock.
func TestAPauseThatEndedIsLiftedInALongTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s, err := pauses.NewStore(db.Schema)
	require.NoError(t, err)
	ctx := context.Background()

	t.Run("paused again in the same transaction, after the first pause ended", func(t *testing.T) {
		scope := pauses.Topic("emails")
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		paused, err := s.PauseFor(ctx, tx, "same-tx", scope, time.Millisecond, "ops", "a blip")
		require.NoError(t, err)
		require.True(t, paused)
		// The pause ends 1ms after its clock_timestamp(): wait well past it.
		_, err = tx.Exec(ctx, "SELECT pg_sleep(0.2)")
		require.NoError(t, err)

		list, err := s.List(ctx, tx, "same-tx")
		require.NoError(t, err)
		require.Empty(t, list, "a pause that ended 200ms ago by the server's clock is listed as holding: %+v", list)

		paused, err = s.PauseFor(ctx, tx, "same-tx", scope, time.Hour, "oncall", "the partner is down")
		require.NoError(t, err)
		require.True(t, paused, "a pause over one that ended is a new pause")
		list, err = s.List(ctx, tx, "same-tx")
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.Equal(t, "oncall", list[0].By, "the hour-long pause is credited to the 1ms one's author")
	})

	t.Run("paused in a transaction opened before another's short pause ended", func(t *testing.T) {
		scope := pauses.Partition("payments", 1)
		long, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer long.Rollback(ctx)
		_, err = long.Exec(ctx, "SELECT 1") // the transaction's now() is taken
		require.NoError(t, err)

		paused, err := s.PauseFor(ctx, db.Pool, "other-tx", scope, time.Millisecond, "ops", "a blip")
		require.NoError(t, err)
		require.True(t, paused)
		waitListed(t, s, db, "other-tx", 0) // ended, by the server's clock

		paused, err = s.PauseFor(ctx, long, "other-tx", scope, time.Hour, "oncall", "the partner is down")
		require.NoError(t, err)
		require.NoError(t, long.Commit(ctx))
		list, err := s.List(ctx, db.Pool, "other-tx")
		require.NoError(t, err)
		require.Len(t, list, 1)
		require.True(t, paused, "a pause over one that ended is a new pause; listed: %+v", list[0])
		require.Equal(t, "oncall", list[0].By, "the hour-long pause is credited to the 1ms one's author")
	})

	t.Run("resumed in the same transaction after it ended", func(t *testing.T) {
		scope := pauses.Topic("sms")
		tx, err := db.Pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		_, err = s.PauseFor(ctx, tx, "resume-tx", scope, time.Millisecond, "ops", "a blip")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SELECT pg_sleep(0.2)")
		require.NoError(t, err)
		resumed, err := s.Resume(ctx, tx, "resume-tx", scope)
		require.NoError(t, err)
		require.False(t, resumed, "resumed a pause that had ended")
	})
}
