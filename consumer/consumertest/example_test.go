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

// A test of a BatchHandler: HandleBatch delivers the messages to a real
// consumer, which calls the handler with the batch in its own transaction,
// after the claims. A message that fails is set aside on its own, its
// neighbours applied; a second delivery of the same messages is skipped.
func ExampleHandleBatch() {
	var t *testing.T       // the test's *testing.T
	var pool *pgxpool.Pool // a pool to a test database
	credits := consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
		accounts, amounts := make([]string, len(b.Messages)), make([]int64, len(b.Messages))
		for i, m := range b.Messages {
			var c struct {
				Amount int64 `json:"amount"`
			}
			if err := json.Unmarshal(m.Value, &c); err != nil {
				return consumer.Permanent(fmt.Errorf("decode credit: %w", err))
			}
			accounts[i], amounts[i] = string(m.Key), c.Amount
		}
		b.Queue(`UPDATE app.accounts AS a SET balance = a.balance + d.amount
FROM (SELECT id, sum(amount) AS amount FROM unnest($1::text[], $2::bigint[]) AS u(id, amount) GROUP BY id) AS d
WHERE a.id = d.id`, accounts, amounts)
		return nil
	})
	cfg := &consumer.Config{Name: "credits", BatchHandler: credits}
	msgs := []*consumer.Message{
		consumertest.NewMessage([]byte(`{"amount":5}`), consumertest.WithID("c-1"), consumertest.WithKey([]byte("alice"))),
		consumertest.NewMessage([]byte("not json"), consumertest.WithID("c-2"), consumertest.WithKey([]byte("alice"))),
		consumertest.NewMessage([]byte(`{"amount":7}`), consumertest.WithID("c-3"), consumertest.WithKey([]byte("bob"))),
	}

	r := consumertest.HandleBatch(t, pool, cfg, msgs)
	if r.Applied != 2 || r.Outcomes[1].Fate != consumertest.DeadLettered {
		t.Fatalf("want c-1 and c-3 applied, c-2 set aside: %v", r.Outcomes)
	}
	if again := consumertest.HandleBatch(t, pool, cfg, msgs); again.Applied != 0 {
		t.Fatalf("a second delivery applied messages again: %v", again.Outcomes)
	}
}
