package outbox_test

import (
	"context"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// A BatchHandler that records orders and queues an e-mail for each, in
// one round trip: the outbox rows are queued with the handler's own
// statement and commit with the batch, or not at all. Each row's id comes
// from the message id, so the e-mail provider, given it as the idempotency
// key, sends once however often the relay delivers.
func ExampleOutbox_Queue() {
	box, err := outbox.New("kafkaonce")
	if err != nil {
		panic(err)
	}
	orders := consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
		ids, bodies := make([]string, len(b.Messages)), make([][]byte, len(b.Messages))
		emails := make([]outbox.Message, len(b.Messages))
		for i, m := range b.Messages {
			ids[i], bodies[i] = m.ID, m.Value
			emails[i] = outbox.Message{ID: "email:" + m.ID, Destination: "email", Key: m.Key, Value: m.Value}
		}
		b.Queue(`INSERT INTO app.orders (id, body) SELECT * FROM unnest($1::text[], $2::bytea[])`, ids, bodies)
		_, err := box.Queue(ctx, b, emails...) // refused here, naming the field, if a row cannot be stored
		return err
	})
	_ = &consumer.Config{Name: "orders", BatchHandler: orders}
}
