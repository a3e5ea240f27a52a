package consumer_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestCanaryPasswordsNeverLeak(t *testing.T) {
	t.Parallel()
	const pgCanary, kafkaCanary = "pg-canary-7Hq2", "kafka-canary-9Xw4"
	// A Kafka cluster that wants SASL, with the canary as the password.
	secured, err := devenv.StartFakeKafka(kfake.EnableSASL(), kfake.Superuser("PLAIN", "ledger", kafkaCanary), kfake.SeedTopics(1, "orders", "orders.dlq"))
	require.NoError(t, err)
	t.Cleanup(func() { secured.Close() })
	// PLAIN to a loopback broker without TLS: the one place it may go in
	// clear, and the one mechanism whose password is on the wire to leak.
	auth := &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "ledger", Password: kafkaCanary, AllowPlaintext: true}

	// A Postgres role with the canary as its password, in the DSN.
	db := testenv.NewDB(t)
	role := db.Schema + "_role"
	db.Exec(t, `CREATE ROLE `+role+` LOGIN PASSWORD '`+pgCanary+`'`)
	t.Cleanup(func() { db.Exec(t, `DROP OWNED BY `+role+`; DROP ROLE `+role) })
	db.Exec(t, `GRANT ALL ON SCHEMA `+db.Schema+` TO `+role+`; GRANT ALL ON ALL TABLES IN SCHEMA `+db.Schema+` TO `+role+`; GRANT ALL ON ALL SEQUENCES IN SCHEMA `+db.Schema+` TO `+role)
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, pgCanary
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	w := &kafka.Writer{Addr: kafka.TCP(secured.Brokers...), Topic: "orders", Transport: &kafka.Transport{SASL: plain.Mechanism{Username: "ledger", Password: kafkaCanary}}, BatchTimeout: time.Millisecond}
	require.NoError(t, w.WriteMessages(context.Background(), msg(0, "good", "1"), msg(0, "bad", "2")))
	require.NoError(t, w.Close())

	logs := &syncBuffer{}
	hooks := &tap{}
	c, err := consumer.New(pool, &consumer.Config{
		Name: "ledger", KafkaClient: kafkaClient(), GroupID: testenv.Name(t, "g"), Brokers: secured.Brokers, Topics: []string{"orders"}, Schema: db.Schema,
		SASL: auth, DeadLetterTopic: "orders.dlq", SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug - 8})),
		Hooks:  []consumer.Hook{hooks},
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.ID == "bad" {
				return consumer.Permanent(errors.New("rejected"))
			}
			return nil
		}),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 30*time.Second, "the letter published", func() bool {
		return db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")+` WHERE published_at IS NOT NULL`) == 1
	})
	cancel()
	require.NoError(t, <-done)

	// And a failure to connect: the error names the server, not the secret.
	broken := cfg.Copy()
	broken.ConnConfig.Port = 1
	bp, err := pgxpool.NewWithConfig(context.Background(), broken)
	require.NoError(t, err)
	defer bp.Close()
	c2, err := consumer.New(bp, &consumer.Config{Name: "ledger", Brokers: secured.Brokers, Topics: []string{"orders"}, Schema: db.Schema,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })})
	require.NoError(t, err)
	// Run waits for the database, logging why; Redrive fails at once.
	waitCtx, stopWaiting := context.WithTimeout(context.Background(), 2*time.Second)
	defer stopWaiting()
	require.NoError(t, c2.Run(waitCtx))
	require.Contains(t, logs.String(), "waiting for Postgres")
	_, runErr := c2.Redrive(context.Background(), consumer.RedriveFilter{})
	require.Error(t, runErr)

	var letters strings.Builder
	rows, err := db.Pool.Query(context.Background(), `SELECT row_to_json(d)::text FROM `+db.Table("dead_letters")+` d`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		letters.WriteString(s)
	}
	require.NoError(t, rows.Err())

	require.NotEmpty(t, logs.String())
	require.Len(t, hooks.snap().dead, 1, "the hooks saw the dead letter")
	for what, text := range map[string]string{"logs": logs.String(), "error": runErr.Error(), "hook payloads": hooks.snap().text(), "dead letters": letters.String()} {
		require.NotContains(t, text, pgCanary, "the Postgres password leaked into the %s", what)
		require.NotContains(t, text, kafkaCanary, "the Kafka password leaked into the %s", what)
	}
}

func TestSASLReachesTheDeadLetterWriterAndTheOutboxRelay(t *testing.T) {
	t.Parallel()
	secured, err := devenv.StartFakeKafka(kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "u", "p"), kfake.SeedTopics(1, "in", "in.dlq", "out", "in2", "in2.dlq"))
	require.NoError(t, err)
	t.Cleanup(func() { secured.Close() })
	auth := &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA256, Username: "u", Password: "p"}
	mech, err := scram.Mechanism(scram.SHA256, "u", "p")
	require.NoError(t, err)
	db := testenv.NewDB(t)

	// The consumer's reads, commits and dead-letter writes, with the SASL
	// setting under either client, and with a kafka-go Dialer of the
	// user's under kafka-go.
	for _, c := range []struct {
		name, topic string
		set         func(*consumer.Config)
	}{
		{"SASL", "in", func(cfg *consumer.Config) { cfg.KafkaClient, cfg.SASL = kafkaClient(), auth }},
		{"kafka-go Dialer", "in2", func(cfg *consumer.Config) {
			cfg.KafkaClient, cfg.Dialer = consumer.KafkaGo, &kafka.Dialer{Timeout: 5 * time.Second, SASLMechanism: mech}
		}},
	} {
		w := &kafka.Writer{Addr: kafka.TCP(secured.Brokers...), Topic: c.topic, Transport: &kafka.Transport{SASL: mech}, BatchTimeout: time.Millisecond}
		require.NoError(t, w.WriteMessages(context.Background(), msg(0, "x-"+c.topic, "poison")))
		require.NoError(t, w.Close())
		cfg := &consumer.Config{Name: "c-" + c.topic, GroupID: testenv.Name(t, "g"), Brokers: secured.Brokers, Topics: []string{c.topic},
			Schema: db.Schema, DeadLetterTopic: c.topic + ".dlq", SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
			Logger: quietLogger(), Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
				return consumer.Permanent(errors.New("no"))
			})}
		c.set(cfg)
		cons, err := consumer.New(db.Pool, cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- cons.Run(ctx) }()
		waitFor(t, 30*time.Second, "the letter published over SASL, "+c.name, func() bool {
			return db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")+` WHERE published_at IS NOT NULL AND consumer = $1`, cfg.Name) == 1
		})
		cancel()
		require.NoError(t, <-done)
	}

	// The outbox relay.
	box, err := outbox.New(db.Schema)
	require.NoError(t, err)
	_, err = box.Write(context.Background(), db.Pool, outbox.Message{Destination: "out", Value: []byte("hi")})
	require.NoError(t, err)
	relay, err := outbox.NewRelay(db.Pool, &outbox.RelayConfig{Schema: db.Schema, Brokers: secured.Brokers, SASL: auth, Logger: quietLogger()})
	require.NoError(t, err)
	rctx, rcancel := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- relay.Run(rctx) }()
	waitFor(t, 30*time.Second, "the outbox row published over SASL", func() bool {
		return db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")) == 0
	})
	rcancel()
	require.NoError(t, <-rdone)
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: secured.Brokers, Dialer: &kafka.Dialer{Timeout: 5 * time.Second, SASLMechanism: mech}, Topic: "out", Partition: 0, MaxWait: 100 * time.Millisecond})
	defer rd.Close()
	rctx2, rc2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer rc2()
	m, err := rd.ReadMessage(rctx2)
	require.NoError(t, err)
	require.Equal(t, "hi", string(m.Value))
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(&syncBuffer{}, nil)) }

func TestAHostileConsumerNameIsJustData(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.name = `x'); DROP TABLE processed_messages; -- "ü`
	ids := e.produceIDs("h", 5)
	r := e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	r.stop()
	e.check(expectation{ids: ids})
	require.EqualValues(t, 5, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1"), e.name))
}

func FuzzConsumerNameValidation(f *testing.F) {
	for _, s := range []string{"ledger", "", " padded ", "tab\there", "x'); DROP TABLE t; --", "ü", "\xff", strings.Repeat("n", 201)} {
		f.Add(s)
	}
	handler := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		f.Fatal(err)
	}
	defer pool.Close()
	f.Fuzz(func(t *testing.T, name string) {
		_, err := consumer.New(pool, &consumer.Config{Name: name, Brokers: []string{"localhost:9092"}, Topics: []string{"t"}, Handler: handler})
		if err != nil {
			if !strings.Contains(err.Error(), "consumer: Name ") {
				t.Fatalf("rejected %q without naming the field: %v", name, err)
			}
			return
		}
		// Accepted names are printable UTF-8 of bounded length, trimmed: safe
		// in logs and as a bound parameter.
		if name == "" || len(name) > consumer.MaxNameLen || !utf8.ValidString(name) || strings.TrimSpace(name) != name ||
			strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
			t.Fatalf("accepted %q", name)
		}
	})
}

// A cluster that wants TLS with a client certificate (mTLS) and SCRAM:
// Config.TLS and Config.SASL reach every connection the consumer makes
// (the group, the fetches, the log bounds, the dead-letter topic), and a
// consumer without the client certificate gets nowhere.
func TestMutualTLSAndSCRAMReachEveryConnection(t *testing.T) {
	t.Parallel()
	p := testenv.NewPKI(t)
	secured, err := devenv.StartFakeKafka(kfake.TLS(p.ServerTLS(t)), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "ledger", "s3cret"),
		kfake.SeedTopics(1, "orders", "orders.dlq"))
	require.NoError(t, err)
	t.Cleanup(func() { secured.Close() })
	cert, key := p.Issue(t, "ledger", x509.ExtKeyUsageClientAuth)
	tlsCfg, err := kafkaconn.TLSConfig(kafkaconn.TLSFiles{CAFile: p.CAFile, CertFile: cert, KeyFile: key})
	require.NoError(t, err)
	auth := &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA512, Username: "ledger", Password: "s3cret"}
	mech, err := kafkaclient.Mechanism(auth)
	require.NoError(t, err)
	producer, err := kgo.NewClient(kgo.SeedBrokers(secured.Brokers...), kgo.DialTLSConfig(tlsCfg.Clone()), kgo.SASL(mech), kgo.DefaultProduceTopic("orders"))
	require.NoError(t, err)
	defer producer.Close()
	for _, id := range []string{"good", "bad"} {
		require.NoError(t, producer.ProduceSync(context.Background(), &kgo.Record{Value: []byte(id), Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}).FirstErr())
	}

	db := testenv.NewDB(t)
	newConsumer := func(name string, tlsCfg *tls.Config, hooks ...consumer.Hook) *consumer.Consumer {
		c, err := consumer.New(db.Pool, &consumer.Config{Name: name, KafkaClient: kafkaClient(), GroupID: testenv.Name(t, name), Brokers: secured.Brokers,
			Topics: []string{"orders"}, Schema: db.Schema, TLS: tlsCfg, SASL: auth, DeadLetterTopic: "orders.dlq",
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, Logger: quietLogger(), Hooks: hooks,
			Handler: consumer.HandlerFunc(func(_ context.Context, _ pgx.Tx, m *consumer.Message) error {
				if m.ID == "bad" {
					return consumer.Permanent(errors.New("rejected"))
				}
				return nil
			})})
		require.NoError(t, err)
		return c
	}
	c := newConsumer("ledger", tlsCfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, 30*time.Second, "the letter published over mTLS", func() bool {
		return db.Int(t, `SELECT count(*) FROM `+db.Table("dead_letters")+` WHERE published_at IS NOT NULL`) == 1
	})
	cancel()
	require.NoError(t, <-done)
	require.EqualValues(t, 2, db.Int(t, `SELECT count(*) FROM `+db.Table("processed_messages")))

	// The CA alone, without the client certificate: the broker refuses.
	caOnly, err := kafkaconn.TLSConfig(kafkaconn.TLSFiles{CAFile: p.CAFile})
	require.NoError(t, err)
	events := &recorder{}
	c = newConsumer("anonymous", caOnly, events)
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	require.NoError(t, c.Run(ctx))
	require.Empty(t, events.snapshot().assigned, "a member without the client certificate must not be assigned partitions")
}
