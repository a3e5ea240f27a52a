package consumertest_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestHandleAppliesInARolledBackTransaction(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("notes")+` (id text PRIMARY KEY, body text)`)
	insert := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+db.Table("notes")+` VALUES ($1, $2)`, m.ID, string(m.Value))
		return err
	})

	t.Run("inner", func(t *testing.T) {
		tx := consumertest.Tx(t, db.Pool)
		require.NoError(t, consumertest.Handle(context.Background(), t, tx, insert, consumertest.NewMessage([]byte("hello"), consumertest.WithID("n-1"))))
		var body string
		require.NoError(t, tx.QueryRow(context.Background(), `SELECT body FROM `+db.Table("notes")+` WHERE id = 'n-1'`).Scan(&body))
		require.Equal(t, "hello", body)
	})
	require.Zero(t, db.Int(t, `SELECT count(*) FROM `+db.Table("notes")), "nothing was committed")
}

func TestHandleUndoesAFailedHandlerAndKeepsTheTransactionUsable(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("notes")+` (id text PRIMARY KEY)`)
	failing := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+db.Table("notes")+` VALUES ($1)`, m.ID); err != nil {
			return err
		}
		return errors.New("partner down")
	})
	tx := consumertest.Tx(t, db.Pool)
	err := consumertest.Handle(context.Background(), t, tx, failing, consumertest.NewMessage(nil))
	require.EqualError(t, err, "partner down")
	var n int
	require.NoError(t, tx.QueryRow(context.Background(), `SELECT count(*) FROM `+db.Table("notes")).Scan(&n))
	require.Zero(t, n, "the failed handler's insert was undone")
}

func TestHandleReportsMisuseLikeTheConsumer(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	tx := consumertest.Tx(t, db.Pool)
	ctx := context.Background()

	commits := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
		_ = tx.Commit(ctx)
		return nil
	})
	require.ErrorIs(t, consumertest.Handle(ctx, t, tx, commits, consumertest.NewMessage(nil)), consumer.ErrTxControlledByConsumer)

	panics := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { panic("boom") })
	err := consumertest.Handle(ctx, t, tx, panics, consumertest.NewMessage(nil))
	require.ErrorIs(t, err, consumer.ErrHandlerPanicked)
	require.ErrorContains(t, err, "boom")

	swallows := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
		_, _ = tx.Exec(ctx, `SELECT * FROM no_such_table`)
		return nil
	})
	require.ErrorIs(t, consumertest.Handle(ctx, t, tx, swallows, consumertest.NewMessage(nil)), consumer.ErrTxAborted)
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err, "the test's transaction is still usable")
}

// Handlers that leave the test's transaction unusable are reported as the
// consumer reports them.
func TestHandleReportsAnUnusableTransaction(t *testing.T) {
	t.Parallel()
	var bare testenv.BareConns
	db := testenv.NewEmptyDB(t, bare.Option())
	for name, tc := range map[string]struct {
		h    consumer.HandlerFunc
		want []error
	}{
		"sends a statement that would end it": {func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			_, err := tx.Exec(ctx, `COMMIT`)
			return err
		}, []error{consumer.ErrTxControlledByConsumer}},
		// The guard hands out no bare connection: code that reached it
		// some other way and ended the transaction there.
		"ends it around the guard": {func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			conn, err := bare.Of(ctx, tx)
			if err != nil {
				return err
			}
			_, err = conn.Exec(ctx, `ROLLBACK`)
			return err
		}, []error{consumer.ErrTxEnded, consumer.ErrTxControlledByConsumer}},
		"leaves rows open": {func(ctx context.Context, tx pgx.Tx, _ *consumer.Message) error {
			rows, err := tx.Query(ctx, `SELECT generate_series(1, 3)`)
			rows.Next()
			return err
		}, []error{consumer.ErrRowsLeftOpen}},
	} {
		t.Run(name, func(t *testing.T) {
			tx := consumertest.Tx(t, db.Pool)
			err := consumertest.Handle(context.Background(), t, tx, tc.h, consumertest.NewMessage(nil))
			for _, want := range tc.want {
				require.ErrorIs(t, err, want)
			}
		})
	}
}

func TestNewMessageDefaultsAndOptions(t *testing.T) {
	t.Parallel()
	m := consumertest.NewMessage([]byte("v"))
	require.Equal(t, consumertest.DefaultID, m.ID)
	id, err := consumer.IDFromHeader("").MessageID(m)
	require.NoError(t, err)
	require.Equal(t, m.ID, id, "the id header agrees with ID, as the default MessageID reads it")

	m = consumertest.NewMessage([]byte("v"), consumertest.WithID("x"), consumertest.WithKey([]byte("k")),
		consumertest.WithHeader("trace", []byte("t")), consumertest.WithPosition("orders", 2, 99))
	require.Equal(t, "x", m.ID)
	require.Equal(t, "orders/2/99", m.Position())
	v, ok := m.Header("trace")
	require.True(t, ok)
	require.Equal(t, "t", string(v))
}

// NewMessageFor derives the id as the consumer configured by cfg would, and
// fails the test where the consumer would set the message aside.
func TestNewMessageForDerivesTheConsumersID(t *testing.T) {
	t.Parallel()
	cfg := &consumer.Config{MessageID: consumer.IDFromJSONField("event_id")}
	m := consumertest.NewMessageFor(t, cfg, []byte(`{"event_id":"e-42"}`), consumertest.WithKey([]byte("k")))
	require.Equal(t, "e-42", m.ID, "the id from the value, not DefaultID")

	m = consumertest.NewMessageFor(t, &consumer.Config{}, nil, consumertest.WithID("from-header"))
	require.Equal(t, "from-header", m.ID, "no MessageID: the default header, as consumer.New sets it")

	got := &captured{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		consumertest.NewMessageFor(capturingTB{TB: t, got: got}, cfg, []byte(`{"other":1}`))
	}()
	<-done
	require.Len(t, got.failures(), 1)
	require.Contains(t, got.failures()[0], "derives no valid id")
	require.Contains(t, got.failures()[0], "invalid_id")
}

// Handle runs the handler as the consumer does, through the same guard:
// a text of two statements reaches the server as one Parse message, which
// the server refuses whole, whatever client encoding the handler set
// first (here one in which the quote's backslash is part of a character).
func TestHandleSendsOneStatementPerMessage(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	notes := db.Table("notes")
	db.Exec(t, `CREATE TABLE `+notes+` (id text)`)
	tx := consumertest.Tx(t, db.Pool)
	err := consumertest.Handle(context.Background(), t, tx, consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if _, err := tx.Exec(ctx, `SET LOCAL client_encoding = 'SJIS'`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT E'\x95\\' AS memo; ROLLBACK; INSERT INTO "+notes+" VALUES ('smuggled'); SELECT 1")
		return err
	}), consumertest.NewMessage(nil))
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42601", pgErr.Code, "cannot insert multiple commands into a prepared statement")
	require.Zero(t, db.Int(t, `SELECT count(*) FROM `+notes))
}
