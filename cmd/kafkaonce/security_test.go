package main

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/kafkaconn"
)

// The CLI reaches a cluster that wants mTLS and SCRAM with the flags, as
// the consumer does with its Config: status and audit read the group,
// the bounds and the records; without the client certificate they cannot.
func TestTheCLIConnectsWithTLSFilesAndSASL(t *testing.T) {
	t.Parallel()
	p := testenv.NewPKI(t)
	fk, err := devenv.StartFakeKafka(kfake.TLS(p.ServerTLS(t)), kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", "ops", "pw"), kfake.SeedTopics(1, "orders"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = fk.Close() })
	cert, key := p.Issue(t, "ops", x509.ExtKeyUsageClientAuth)
	tlsCfg, err := kafkaconn.TLSConfig(kafkaconn.TLSFiles{CAFile: p.CAFile, CertFile: cert, KeyFile: key})
	require.NoError(t, err)
	auth := &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA256, Username: "ops", Password: "pw"}
	mech, err := kafkaclient.Mechanism(auth)
	require.NoError(t, err)
	producer, err := kgo.NewClient(kgo.SeedBrokers(fk.Brokers...), kgo.DialTLSConfig(tlsCfg.Clone()), kgo.SASL(mech), kgo.DefaultProduceTopic("orders"))
	require.NoError(t, err)
	defer producer.Close()
	for _, id := range []string{"m-0", "m-1", "m-2"} {
		require.NoError(t, producer.ProduceSync(context.Background(), &kgo.Record{Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}}).FirstErr())
	}
	db := testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	w := &world{t: t, db: db, kafka: &testenv.Kafka{Kafka: fk}, topic: "orders", name: testenv.Name(t, "c")}
	w.runUntil(func(c *consumer.Config) { c.TLS, c.SASL = tlsCfg, auth }, "the 3 messages processed", func() bool {
		return db.Int(t, `SELECT coalesce(max(next_offset), 0) FROM `+db.Table("consumer_offsets")) >= 3
	})()

	env := map[string]string{"DATABASE_URL": db.URL, "KAFKA_BROKERS": strings.Join(fk.Brokers, ","), "KAFKA_PASSWORD": "pw"}
	secure := []string{"--kafka-ca-file", p.CAFile, "--kafka-cert-file", cert, "--kafka-key-file", key, "--kafka-sasl", "scram-sha-256", "--kafka-user", "ops"}
	out, errOut, code := w.cliWith(env, append([]string{"status", "--consumer", w.name}, secure...)...)
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, out, "total lag: 0")
	out, errOut, code = w.cliWith(env, append([]string{"audit", "--consumer", w.name}, secure...)...)
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, out, "OK: a replay of this range applies nothing twice (3 messages checked)")
	require.NotContains(t, out+errOut, "pw", "the password was printed")

	// Without the client certificate, or with a mechanism kafkaonce does
	// not speak, the command says why and changes nothing. A broker that
	// refuses the connection is Kafka's side not read: status shows what
	// Postgres holds, and why Kafka gave nothing.
	out, errOut, code = w.cliWith(env, "status", "--consumer", w.name, "--kafka-ca-file", p.CAFile, "--kafka-sasl", "scram-sha-256", "--kafka-user", "ops")
	require.Equal(t, 1, code, out+errOut)
	require.Contains(t, out, "claims: 3 (applied 3")
	require.Contains(t, out, "KAFKA NOT READ for topic orders: its partitions, log bounds and the committed offsets of group "+w.name+" (kafka: metadata of orders: remote error: tls: certificate required: cannot connect to the brokers: TLS handshake failed: the broker refused the client certificate, or wants one (mTLS)")
	_, errOut, code = w.cliWith(env, "status", "--consumer", w.name, "--kafka-sasl", "gssapi")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--kafka-sasl must be one of plain, scram-sha-256, scram-sha-512, oauthbearer, aws_msk_iam")
	_, errOut, code = w.cliWith(env, "status", "--consumer", w.name, "--kafka-sasl", "plain", "--kafka-user", "ops")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--kafka-sasl plain without TLS would send the password in clear: pass --kafka-tls (or --kafka-ca-file)")
	require.Contains(t, errOut, "--kafka-allow-plaintext-sasl")
	_, errOut, code = w.cliWith(env, "status", "--consumer", w.name, "--kafka-cert-file", cert)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "needs both CertFile and KeyFile")
}

// status shows a partition held back by a producer's open transaction,
// while the consumer waits at it.
func TestStatusShowsAPartitionHeldByAnOpenTransaction(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(2, "p")
	cl, err := kgo.NewClient(kgo.SeedBrokers(w.kafka.Brokers...), kgo.TransactionalID(testenv.Name(t, "tx")), kgo.DefaultProduceTopic(w.topic))
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.BeginTransaction())
	require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Value: []byte("open")}).FirstErr())
	stop := w.runUntil(func(c *consumer.Config) { c.OpenTransactionAfter = 200 * time.Millisecond }, "the wait recorded", func() bool {
		return w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("partition_runs")+` WHERE held_at IS NOT NULL`) > 0
	})
	defer stop()
	out, errOut, code := w.cli("status", "--consumer", w.name, "--topic", w.topic)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "HELD "+w.topic+"/0 since ")
	require.Contains(t, out, "a producer's open transaction, from offset 2, holds back what follows until it commits or aborts")
	require.NoError(t, cl.EndTransaction(context.Background(), kgo.TryAbort))
}

// runUntil runs a consumer of w's topic, with adjust's settings and a
// handler that does nothing, until cond holds, and returns what stops it.
func (w *world) runUntil(adjust func(*consumer.Config), what string, cond func() bool) (stop func()) {
	w.t.Helper()
	cfg := &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic}, Schema: w.db.Schema,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })}
	adjust(cfg)
	c, err := consumer.New(w.db.Pool, cfg)
	require.NoError(w.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stop = func() { cancel(); require.NoError(w.t, <-done) }
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			stop()
			w.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return stop
}
