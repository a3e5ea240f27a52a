package usercall_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/notx"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var quick = usercall.Limits{Timeout: 100 * time.Millisecond, Grace: 200 * time.Millisecond}

// inTx runs one attempt whose call gets a real transaction, and returns
// the call's error (or the abandonment).
func inTx(t *testing.T, ctx context.Context, l usercall.Limits, fn func(ctx context.Context, tx pgx.Tx) error) (error, *usercall.Abandoned) {
	t.Helper()
	return inTxOn(t, testenv.NewEmptyDB(t), ctx, l, fn, nil)
}

// inTxOn is inTx on db; after, when set, gets what the call returned,
// inside the attempt, even when the attempt was abandoned meanwhile.
func inTxOn(t *testing.T, db *testenv.DB, ctx context.Context, l usercall.Limits, fn func(ctx context.Context, tx pgx.Tx) error, after func(ctx context.Context, callErr error)) (error, *usercall.Abandoned) {
	t.Helper()
	return usercall.Run(ctx, l, func(hctx, ctx context.Context, a *usercall.Attempt) error {
		pooled, err := db.Pool.Acquire(ctx)
		if err != nil {
			return err
		}
		// A connection the watchdog may close is not given back to the pool.
		conn := pooled.Hijack()
		defer conn.Close(context.WithoutCancel(ctx))
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		a.SetConn(conn.PgConn().Conn())
		err = a.Call(hctx, 7, tx, fn)
		if after != nil {
			after(ctx, err)
		}
		return err
	})
}

func TestCallTurnsWhatAHandlerHidesIntoErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, tc := range map[string]struct {
		fn   func(ctx context.Context, tx pgx.Tx) error
		want error
	}{
		"panic": {func(context.Context, pgx.Tx) error { panic("boom") }, usercall.ErrPanicked},
		"commit": {func(ctx context.Context, tx pgx.Tx) error {
			_ = tx.Commit(ctx)
			return nil
		}, txguard.ErrTxControlled},
		"swallowed SQL error": {func(ctx context.Context, tx pgx.Tx) error {
			_, _ = tx.Exec(ctx, `SELECT 1/0`)
			return nil
		}, usercall.ErrTxAborted},
		"own error": {func(context.Context, pgx.Tx) error { return context.DeadlineExceeded }, context.DeadlineExceeded},
		"timed out, then returned": {func(ctx context.Context, _ pgx.Tx) error {
			<-ctx.Done()
			return nil
		}, usercall.ErrTimeout},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err, ab := inTx(t, ctx, quick, tc.fn)
			require.Nil(t, ab)
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// A call that ignores its context is abandoned: Run returns, the
// connection is closed under it, and when it finally returns it learns it
// was abandoned and may not go on. Its transaction refuses every use.
func TestAHungCallIsAbandonedAndCannotWriteAfterwards(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	late := make(chan error, 1)
	var txAfter pgx.Tx
	var callErr atomic.Value
	began := time.Now()
	db := testenv.NewEmptyDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (v int)`)
	_, ab := inTxOn(t, db, context.Background(), quick, func(_ context.Context, tx pgx.Tx) error {
		txAfter = tx
		<-release
		return nil
	}, func(ctx context.Context, err error) {
		callErr.Store(err)
		_, lateErr := txAfter.Exec(ctx, `INSERT INTO `+db.Table("effects")+` VALUES (1)`)
		late <- lateErr
	})
	require.NotNil(t, ab)
	require.Equal(t, 7, ab.Index)
	require.True(t, ab.TimedOut)
	require.ErrorIs(t, ab.Err(), usercall.ErrTimeout)
	require.Less(t, time.Since(began), 5*time.Second)
	close(release)
	require.ErrorIs(t, <-late, txguard.ErrCallOver, "the sealed transaction refuses")
	require.ErrorIs(t, callErr.Load().(error), usercall.ErrAbandoned)
	require.Zero(t, db.Int(t, `SELECT count(*) FROM `+db.Table("effects")))
}

// When the caller's context ends (a shutdown), a call that ignores it is
// abandoned after the grace, however long its timeout.
func TestACallIsAbandonedGraceAfterTheCallersContextEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{})
	go func() { <-entered; cancel() }()
	began := time.Now()
	_, ab := usercall.Run(ctx, usercall.Limits{Timeout: time.Hour, Grace: 100 * time.Millisecond}, func(hctx, _ context.Context, a *usercall.Attempt) error {
		return a.Call(hctx, 0, &notx.Tx{}, func(context.Context, pgx.Tx) error {
			close(entered)
			<-release
			return nil
		})
	})
	require.NotNil(t, ab)
	require.False(t, ab.TimedOut)
	require.ErrorIs(t, ab.Err(), usercall.ErrAbandoned)
	require.Less(t, time.Since(began), 5*time.Second)
}

// Outside a call nothing is abandoned: the attempt's own statements end
// by their context.
func TestNothingIsAbandonedBetweenCalls(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	out, ab := usercall.Run(ctx, quick, func(_, ctx context.Context, _ *usercall.Attempt) error {
		time.Sleep(3 * quick.Grace)
		return errors.New("finished")
	})
	require.Nil(t, ab)
	require.EqualError(t, out, "finished")
}

// Savepoints a handler makes are guarded too: released and rolled back as
// usual during the call, refused after it.
func TestSavepointsAreGuardedToo(t *testing.T) {
	t.Parallel()
	var sp pgx.Tx
	err, ab := inTx(t, context.Background(), quick, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		if sp, err = tx.Begin(ctx); err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `SELECT 1`); err != nil {
			return err
		}
		return sp.Commit(ctx)
	})
	require.Nil(t, ab)
	require.NoError(t, err)
	_, err = sp.Exec(context.Background(), `SELECT 1`)
	require.ErrorIs(t, err, txguard.ErrCallOver)
}
