package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/outbox"
	"github.com/kafkaonce/kafkaonce/pauses"
)

type Transfer struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
}

// A ledger worker: each transfer moves money between two accounts, once,
// however often Kafka delivers it.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := consumer.Migrate(ctx, pool, ""); err != nil {
		log.Fatal(err)
	}

	c, err := consumer.New(pool, &consumer.Config{
		Name:      "ledger",
		Brokers:   []string{"localhost:9092"},
		Topics:    []string{"transfers"},
		MessageID: consumer.IDFromJSONField("id"),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var t Transfer
			if err := json.Unmarshal(m.Value, &t); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE app.accounts SET balance = balance - $2 WHERE id = $1`, t.From, t.Amount); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE app.accounts SET balance = balance + $2 WHERE id = $1`, t.To, t.Amount)
			return err
		}),
	})
	if err != nil {
		log.Fatal(err) // e.g. "consumer: Topics must name at least one topic, ..."
	}
	if err := c.Run(ctx); err != nil { // blocks; on Ctrl-C drains and returns nil
		log.Fatal(err)
	}
}

func ExampleIDFromJSONField() {
	id := consumer.IDFromJSONField("meta.event_id")
	got, err := id.MessageID(&consumer.Message{Value: []byte(`{"meta":{"event_id":"01J9ZK3V8W"},"amount":5}`)})
	fmt.Println(got, err)
	_, err = id.MessageID(&consumer.Message{Value: []byte(`{"amount":5}`)})
	fmt.Println(err)
	// Output:
	// 01J9ZK3V8W <nil>
	// JSON field "meta.event_id" is missing
}

func ExampleIDFromPosition() {
	id, _ := consumer.IDFromPosition().MessageID(&consumer.Message{Topic: "orders", Partition: 2, Offset: 1041})
	fmt.Println(id)
	// Output: orders/2/1041
}

// Whether the consumer sets a message aside at once or retries it, by the
// error its handler returned. A payload encoding/json cannot decode is
// permanent whether the handler marks it or not; an error that may pass
// is retried.
func ExampleIsRetryLater() {
	partnerDown := errors.New("mail partner unavailable")
	fmt.Println(consumer.IsRetryLater(consumer.RetryLater(partnerDown, time.Minute)))
	fmt.Println(consumer.IsRetryLater(fmt.Errorf("send receipt: %w", consumer.RetryLater(partnerDown, time.Minute))))
	fmt.Println(consumer.IsRetryLater(partnerDown))
	fmt.Println(consumer.IsRetryLater(consumer.Permanent(consumer.RetryLater(partnerDown, time.Minute))))
	// Output:
	// true
	// true
	// false
	// false
}

func ExampleIsPermanent() {
	var t Transfer
	fmt.Println(consumer.IsPermanent(json.Unmarshal([]byte("not json"), &t)))
	fmt.Println(consumer.IsPermanent(consumer.Permanent(errors.New("the partner rejected the account"))))
	fmt.Println(consumer.IsPermanent(fmt.Errorf("post transfer: %w", errors.New("partner answered 503"))))
	// Output:
	// true
	// true
	// false
}

// The ledger worker with a BatchHandler: one statement per batch, queued to
// travel with the COMMIT, so a batch costs two round trips to Postgres.
// Both legs of every transfer become rows of one unnest; the UPDATE sums
// them per account, so two transfers touching one account in a batch add up.
func ExampleBatchHandler() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	c, err := consumer.New(pool, &consumer.Config{
		Name:      "ledger",
		Brokers:   []string{"localhost:9092"},
		Topics:    []string{"transfers"},
		MessageID: consumer.IDFromJSONField("id"),
		BatchHandler: consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
			accounts := make([]string, 0, 2*len(b.Messages))
			amounts := make([]int64, 0, 2*len(b.Messages))
			for _, m := range b.Messages {
				var t Transfer
				if err := json.Unmarshal(m.Value, &t); err != nil {
					// Permanent: when the batch is run again one message per
					// call, this message is dead-lettered and the others
					// applied.
					return consumer.Permanent(err)
				}
				accounts = append(accounts, t.From, t.To)
				amounts = append(amounts, -t.Amount, t.Amount)
			}
			b.Queue(`UPDATE app.accounts AS a SET balance = a.balance + d.amount
FROM (SELECT id, sum(amount) AS amount FROM unnest($1::text[], $2::bigint[]) AS u(id, amount) GROUP BY id) AS d
WHERE a.id = d.id`, accounts, amounts)
			return nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// Liveness and readiness probes for Kubernetes, on a port of their own:
//
//	livenessProbe:
//	  httpGet: {path: /health/livez, port: 8081}
//	  periodSeconds: 10
//	  failureThreshold: 3
//	readinessProbe:
//	  httpGet: {path: /health/readyz, port: 8081}
//	  periodSeconds: 5
//	  timeoutSeconds: 2
func ExampleHealthHandler() {
	var payments, refunds *consumer.Consumer // from consumer.New, each Run in its own goroutine
	mux := http.NewServeMux()
	mux.Handle("/health/", consumer.HealthHandler(payments, refunds))
	go func() { log.Fatal(http.ListenAndServe(":8081", mux)) }()
}

// A pause for an incident: the e-mail partner is down, so the topic's
// partitions stop fetching (and stop retrying) until it is back, in every
// process of the group, across restarts.
func ExampleConsumer_Pause() {
	var c *consumer.Consumer // the notification worker's
	ctx := context.Background()
	if err := c.Pause(ctx, pauses.Topic("emails"), "mail partner down (INC-4711)"); err != nil {
		log.Fatal(err)
	}
	// ... once the partner answers again:
	if err := c.Resume(ctx, pauses.Topic("emails")); err != nil {
		log.Fatal(err)
	}
}

// A notifications worker on a share group: run as many of these processes
// as the partner's API takes, whatever the topic's partition count; each
// notification is queued once, through the outbox, however often and to
// however many members Kafka hands it. Share groups give no order, so this
// fits work whose messages are independent, not a ledger.
func ExampleConfig_shareGroup() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	box, err := outbox.New("")
	if err != nil {
		log.Fatal(err)
	}

	c, err := consumer.New(pool, &consumer.Config{
		Name:      "notifications",
		Brokers:   []string{"localhost:9092"},
		Topics:    []string{"orders"},
		GroupType: consumer.ShareGroup,
		MessageID: consumer.IDFromJSONField("order_id"),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			// The mail goes out through the outbox (an outbox.Relay sends
			// it), whose row commits with the claim: a record handed to two
			// members queues one mail.
			_, err := box.Write(ctx, tx, outbox.Message{ID: "mail:" + m.ID, Destination: "email", Value: m.Value})
			return err
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A ledger worker in a group running the consumer group protocol
// (KIP-848, Kafka 4.0 and later): the broker assigns partitions, and a
// static member (a StatefulSet's pod name) restarted within the group's
// consumer.session.timeout.ms gets its own back while the other members
// go on. The session and heartbeat are the group's configs, set on the
// broker, not here.
func ExampleConfig_consumerProtocol() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	c, err := consumer.New(pool, &consumer.Config{
		Name:          "ledger",
		Brokers:       []string{"localhost:9092"},
		Topics:        []string{"transfers"},
		GroupProtocol: consumer.ConsumerProtocol,
		InstanceID:    os.Getenv("POD_NAME"),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger_entries (transfer_id, body) VALUES ($1, $2)`, m.ID, m.Value)
			return err
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); errors.Is(err, consumer.ErrConsumerProtocolUnavailable) {
		// The brokers are older than Kafka 4.0, or have the protocol off:
		// the member never joined as a classic member instead.
		log.Fatalf("upgrade the brokers or leave GroupProtocol unset: %v", err)
	} else if err != nil {
		log.Fatal(err)
	}
}
