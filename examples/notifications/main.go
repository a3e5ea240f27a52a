// Command notifications sends exactly one e-mail per order event, through an
// e-mail API that is not transactional:
//
//	go run ./examples/notifications
//
// The consumer's handler does not call the API. It records the order and
// writes an outbox row in the same transaction as kafkaonce's claim, so a
// redelivered event writes nothing new. An outbox relay then calls the API
// with the row's id as the Idempotency-Key. The provider (a local fake)
// answers 503 now and then, sometimes sends the e-mail and drops the
// connection before answering, and the first relay dies right after a send,
// before it can record it: each time the relay sends again with the same
// key, and the provider sends nothing twice.
//
// With no setup it uses an in-process Kafka broker and Postgres from
// DATABASE_URL, else local binaries. The last line on stdout is
// a JSON summary; the exit code is 0 only when every order got exactly one
// e-mail.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

const schemaName = "notifications_example"

// OrderPlaced is the event.
type OrderPlaced struct {
	EventID string `json:"event_id"`
	OrderID string `json:"order_id"`
	Email   string `json:"email"`
	Total   int64  `json:"total"`
}

type summary struct {
	Postgres             string `json:"postgres"`
	Kafka                string `json:"kafka"`
	Orders               int    `json:"orders"`
	EventsProduced       int    `json:"events_produced"`
	DuplicateEvents      int64  `json:"duplicate_events_skipped"`
	EmailsSent           int    `json:"emails_sent"`
	APIRequests          int    `json:"api_requests"`
	DedupedByProvider    int    `json:"deduplicated_by_provider"`
	BusyAnswers          int    `json:"busy_answers"`
	LostResponses        int    `json:"lost_responses"`
	RelayCrashes         int    `json:"relay_crashes"`
	Parked               int    `json:"parked"`
	OrdersWithoutEmail   int    `json:"orders_without_email"`
	OrdersWithManyEmails int    `json:"orders_with_more_than_one_email"`
	EveryOrderOneEmail   bool   `json:"every_order_one_email"`
}

func main() {
	orders := flag.Int("orders", 500, "orders to place")
	dupEvery := flag.Int("duplicate-every", 7, "send every Nth event twice")
	busyEvery := flag.Int("busy-every", 20, "the provider answers every Nth new request with 503 Retry-After")
	loseEvery := flag.Int("lose-every", 30, "the provider sends every Nth new e-mail but drops the connection before answering")
	applyEnv := devenv.RegisterFlags(flag.CommandLine)
	flag.Parse()
	applyEnv()
	log.SetFlags(0)
	log.SetPrefix("[notifications] ")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := run(ctx, *orders, *dupEvery, *busyEvery, *loseEvery)
	if err != nil {
		log.Fatal(err)
	}
	out, _ := json.Marshal(s)
	fmt.Println(string(out))
	if !s.EveryOrderOneEmail {
		os.Exit(1)
	}
}

func run(ctx context.Context, nOrders, dupEvery, busyEvery, loseEvery int) (summary, error) {
	var s summary
	env, err := devenv.Start(ctx)
	if err != nil {
		return s, err
	}
	defer env.Close()
	env.Own(schemaName) // dropped when the example ends, unless -keep
	log.Print(env)
	pool := env.Pool
	s.Postgres, s.Kafka = env.PostgresSource, env.KafkaSource
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schemaName+` CASCADE`); err != nil {
		return s, err
	}
	if _, err := consumer.Migrate(ctx, pool, schemaName); err != nil {
		return s, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE notifications_example.orders (order_id text NOT NULL, email text NOT NULL, total bigint NOT NULL)`); err != nil {
		return s, err
	}
	box, err := outbox.New(schemaName)
	if err != nil {
		return s, err
	}

	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := "orders-" + runID
	if err := env.CreateTopic(ctx, topic, 3); err != nil {
		return s, err
	}
	w := &kafka.Writer{Addr: kafka.TCP(env.Brokers...), Topic: topic, Balancer: &kafka.Hash{}, BatchTimeout: time.Millisecond, Transport: &kafka.Transport{}}
	defer w.Close()
	var msgs []kafka.Message
	for i := range nOrders {
		e := OrderPlaced{EventID: fmt.Sprintf("evt-%s-%05d", runID, i), OrderID: fmt.Sprintf("order-%05d", i), Email: fmt.Sprintf("customer%d@example.com", i), Total: int64(1000 + i)}
		v, _ := json.Marshal(e)
		m := kafka.Message{Key: []byte(e.OrderID), Value: v, Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte(e.EventID)}}}
		msgs = append(msgs, m)
		if dupEvery > 0 && i%dupEvery == 0 {
			msgs = append(msgs, m)
		}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return s, err
	}
	s.Orders, s.EventsProduced = nOrders, len(msgs)
	log.Printf("produced %d order events for %d orders", len(msgs), nOrders)

	// The consumer: record the order and ask for its e-mail, in one
	// transaction with the claim.
	counts := &counter{}
	c, err := consumer.New(pool, &consumer.Config{
		Name: "notifications", GroupID: "notifications-" + runID, Brokers: env.Brokers, Topics: []string{topic}, Schema: schemaName,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})), Hooks: []consumer.Hook{counts},
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			var o OrderPlaced
			if err := json.Unmarshal(m.Value, &o); err != nil {
				return consumer.Permanent(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO notifications_example.orders VALUES ($1, $2, $3)`, o.OrderID, o.Email, o.Total); err != nil {
				return err
			}
			body, _ := json.Marshal(email{OrderID: o.OrderID, To: o.Email, Subject: "Your order " + o.OrderID})
			// The id is derived from the event: stable, and unique per e-mail.
			_, err := box.Write(ctx, tx, outbox.Message{ID: "email:" + o.EventID, Destination: "email", Key: []byte(o.OrderID), Value: body})
			return err
		}),
	})
	if err != nil {
		return s, err
	}
	cctx, stopConsumer := context.WithCancel(ctx)
	defer stopConsumer()
	consumerDone := make(chan error, 1)
	go func() { consumerDone <- c.Run(cctx) }()

	// The provider, and the relays that call it.
	prov := newProvider(busyEvery, loseEvery)
	url, stopProvider, err := prov.serve()
	if err != nil {
		return s, err
	}
	defer stopProvider()
	client := &http.Client{Timeout: 2 * time.Second}
	send := func(ctx context.Context, d *outbox.Delivery) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/send", bytes.NewReader(d.Value))
		if err != nil {
			return outbox.Permanent(err)
		}
		req.Header.Set("Idempotency-Key", d.ID)
		req.Header.Set("Content-Type", "application/json")
		return outbox.HTTPResult(client.Do(req))
	}
	relayCfg := outbox.RelayConfig{Schema: schemaName, RetryInitialInterval: 50 * time.Millisecond, RetryMaxInterval: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}

	// Relay 1 dies right after its 100th successful send: its round is not
	// recorded, so everything that round sent is sent again by relay 2.
	r1ctx, crash := context.WithCancel(ctx)
	defer crash()
	var sends atomic.Int64
	cfg1 := relayCfg
	cfg1.Deliver = func(ctx context.Context, d *outbox.Delivery) error {
		err := send(ctx, d)
		if err == nil && sends.Add(1) == 100 {
			log.Print("relay 1 dies after a send, before recording it")
			crash()
		}
		return err
	}
	r1, err := outbox.NewRelay(pool, &cfg1)
	if err != nil {
		return s, err
	}
	r1done := make(chan error, 1)
	go func() { r1done <- r1.Run(r1ctx) }()
	<-r1done
	s.RelayCrashes = 1

	cfg2 := relayCfg
	cfg2.Deliver = send
	r2, err := outbox.NewRelay(pool, &cfg2)
	if err != nil {
		return s, err
	}
	r2ctx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	r2done := make(chan error, 1)
	go func() { r2done <- r2.Run(r2ctx) }()

	deadline := time.Now().Add(3 * time.Minute)
	for {
		pending, err := box.Pending(ctx, pool)
		if err != nil {
			return s, err
		}
		st := prov.stats()
		if counts.seen.Load() >= int64(len(msgs)) && pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("timed out: %d outbox rows pending", pending)
		}
		log.Printf("events settled %d/%d; e-mails sent %d; outbox pending %d", counts.seen.Load(), len(msgs), st.Sent, pending)
		time.Sleep(500 * time.Millisecond)
	}
	stopRelay()
	stopConsumer()
	if err := <-r2done; err != nil {
		return s, err
	}
	if err := <-consumerDone; err != nil {
		return s, err
	}

	parked, err := box.Parked(ctx, pool, 1000)
	if err != nil {
		return s, err
	}
	st := prov.stats()
	s.DuplicateEvents = counts.skipped.Load()
	s.EmailsSent, s.APIRequests, s.DedupedByProvider, s.BusyAnswers, s.LostResponses, s.Parked = st.Sent, st.Requests, st.Deduped, st.Busy, st.Lost, len(parked)
	for i := range nOrders {
		switch n := st.PerOrder[fmt.Sprintf("order-%05d", i)]; {
		case n == 0:
			s.OrdersWithoutEmail++
		case n > 1:
			s.OrdersWithManyEmails++
		}
	}
	s.EveryOrderOneEmail = s.OrdersWithoutEmail == 0 && s.OrdersWithManyEmails == 0 && s.Parked == 0
	log.Printf("%d orders, %d e-mails sent; %d API requests, %d of them repeats the provider recognised by their Idempotency-Key",
		nOrders, st.Sent, st.Requests, st.Deduped)
	return s, nil
}

// counter counts settled events.
type counter struct{ seen, skipped atomic.Int64 }

func (c *counter) OnMessageApplied(context.Context, *consumer.Message) { c.seen.Add(1) }
func (c *counter) OnMessageSkipped(context.Context, *consumer.Message, consumer.SkipReason) {
	c.seen.Add(1)
	c.skipped.Add(1)
}
