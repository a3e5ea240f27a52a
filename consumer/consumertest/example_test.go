package consumertest_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
)

// A test of a handler's effect: run it for a synthetic message inside a
// transaction that is rolled back at the end of the test, and query the
// effect inside that same transaction.
func ExampleHandle() {
	var t *testing.T       // the test's *testing.T
	var pool *pgxpool.Pool // a pool to a test database
	credit := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, `UPDATE app.accounts SET balance = balance + 5 WHERE id = $1`, string(m.Key))
		return err
	})

	tx := consumertest.Tx(t, pool)
	msg := consumertest.NewMessage([]byte(`{"amount":5}`), consumertest.WithID("t-1"), consumertest.WithKey([]byte("alice")))
	if err := consumertest.Handle(context.Background(), t, tx, credit, msg); err != nil {
		t.Fatal(err)
	}
	var balance int
	_ = tx.QueryRow(context.Background(), `SELECT balance FROM app.accounts WHERE id = 'alice'`).Scan(&balance)
}
