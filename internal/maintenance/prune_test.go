package maintenance

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// TestPrunerRun covers the loop around a table's pruning step; the steps
// themselves (the DELETE statements) are the stores' and are tested
// against Postgres there.
func TestPrunerRun(t *testing.T) {
	t.Parallel()
	// inTx runs fn as the consumer's transaction would, counting them.
	type setup struct {
		txs  int
		logs bytes.Buffer
	}
	newSetup := func() *setup { return &setup{} }
	run := func(s *setup, ctx context.Context, deleted []int64, fail error) int64 {
		step := 0
		p := Pruner{Table: "widgets", Step: func(_ context.Context, _ schema.Querier, limit int) (int64, error) {
			require.Equal(t, 10, limit)
			if step == len(deleted) {
				return 0, fail
			}
			step++
			return deleted[step-1], nil
		}}
		inTx := func(ctx context.Context, fn func(q schema.Querier) error) error {
			s.txs++
			return fn(nil)
		}
		return Run(ctx, p, inTx, 10, slog.New(slog.NewTextHandler(&s.logs, nil)))
	}

	t.Run("steps until one comes back short", func(t *testing.T) {
		t.Parallel()
		s := newSetup()
		require.EqualValues(t, 27, run(s, context.Background(), []int64{10, 10, 7}, nil))
		require.Equal(t, 3, s.txs, "a transaction per step")
		require.Empty(t, s.logs.String())
	})
	t.Run("nothing to prune", func(t *testing.T) {
		t.Parallel()
		s := newSetup()
		require.EqualValues(t, 0, run(s, context.Background(), []int64{0}, nil))
		require.Equal(t, 1, s.txs)
	})
	t.Run("a failing step ends the run, said once", func(t *testing.T) {
		t.Parallel()
		s := newSetup()
		require.EqualValues(t, 20, run(s, context.Background(), []int64{10, 10}, errors.New("disk full")))
		require.Equal(t, 3, s.txs)
		require.Contains(t, s.logs.String(), "pruning widgets failed; will try at the next interval")
		require.Contains(t, s.logs.String(), "disk full")
	})
	t.Run("a done context runs no step and logs nothing", func(t *testing.T) {
		t.Parallel()
		s := newSetup()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.EqualValues(t, 0, run(s, ctx, []int64{10}, nil))
		require.Zero(t, s.txs)
		require.Empty(t, s.logs.String())
	})
}
