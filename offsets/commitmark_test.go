package offsets_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/commitmark"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

func TestCommitMark(t *testing.T) {
	t.Run("reads what a consumer commits", func(t *testing.T) {
		written := commitmark.Mark{Store: "0b6a5f1e-52f4-4a3c-9d3e-1f2a3b4c5d6e", Consumer: "a name with spaces first=3", First: -1}
		m, ok := offsets.ParseCommitMark(written.String())
		require.True(t, ok)
		require.Equal(t, offsets.CommitMark{Store: written.Store, Consumer: written.Consumer, First: -1}, m)
	})
	t.Run("other metadata is no mark", func(t *testing.T) {
		for _, s := range []string{"", "member-1-4f2c", "kafkaonce/2 store=x first=0 consumer=ledger"} {
			m, ok := offsets.ParseCommitMark(s)
			require.False(t, ok, "%q", s)
			require.Zero(t, m)
		}
	})
	t.Run("the store id is the schema's, the one its consumers mark", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		db, other := testenv.NewDB(t), testenv.NewDB(t)
		s, _ := offsets.NewStore(db.Schema)
		id, err := s.StoreID(ctx, db.Pool)
		require.NoError(t, err)
		require.NotEmpty(t, id)
		again, err := s.StoreID(ctx, db.Pool)
		require.NoError(t, err)
		require.Equal(t, id, again, "made once, at migration")
		o, _ := offsets.NewStore(other.Schema)
		otherID, err := o.StoreID(ctx, other.Pool)
		require.NoError(t, err)
		require.NotEqual(t, id, otherID, "a schema migrated anew is another store")
	})
}
