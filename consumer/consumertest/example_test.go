package consumertest_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// A test that a message which does not decode is set aside at once, not
// retried: consumer.IsPermanent of what Handle returns is the consumer's
// own verdict on that error. The handler returns encoding/json's error
// without marking it; the consumer takes such an error as permanent all
// the same.
func ExampleHandle_permanent() {
	var t *testing.T       // the test's *testing.T
	var pool *pgxpool.Pool // a pool to a test database
	credit := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var c struct {
			Account string `json:"account"`
			Amount  int64  `json:"amount"`
		}
		if err := json.Unmarshal(m.Value, &c); err != nil {
			return fmt.Errorf("decode credit: %w", err)
		}
		_, err := tx.Exec(ctx, `UPDATE app.accounts SET balance = balance + $2 WHERE id = $1`, c.Account, c.Amount)
		return err
	})

	tx := consumertest.Tx(t, pool)
	err := consumertest.Handle(context.Background(), t, tx, credit, consumertest.NewMessage([]byte("not json")))
	if !consumer.IsPermanent(err) {
		t.Fatalf("a credit that does not decode would be retried, not set aside: %v", err)
	}
}
