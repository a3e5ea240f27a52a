package pauses_test

import (
	"context"
	"strings"
	"testing"

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

func scopes(ps []pauses.Pause) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Scope.String())
	}
	return out
}
