package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func TestMain(m *testing.M) { testenv.Main(m) }

// world is one test's database schema, topic and consumer.
type world struct {
	t     *testing.T
	db    *testenv.DB
	kafka *testenv.Kafka
	topic string
	name  string
}

func newWorld(t *testing.T, partitions int) *world {
	db := testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	k := testenv.NewKafka(t)
	return &world{t: t, db: db, kafka: k, topic: k.Topic(t, partitions), name: testenv.Name(t, "c")}
}

// cli runs the command in-process and returns its output and exit code.
func (w *world) cli(args ...string) (stdout, stderr string, code int) {
	env := map[string]string{"DATABASE_URL": w.db.URL}
	if w.kafka != nil {
		env["KAFKA_BROKERS"] = strings.Join(w.kafka.Brokers, ",")
	}
	return w.cliWith(env, args...)
}

func (w *world) cliWith(env map[string]string, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	st := streams{in: strings.NewReader(""), out: &out, err: &errb, terminal: func() bool { return false }, getenv: func(k string) string { return env[k] }}
	code := run(append([]string{"--schema", w.db.Schema}, args...), st)
	return out.String(), errb.String(), code
}

func (w *world) produce(n int, prefix string) {
	var msgs []kafka.Message
	for i := range n {
		id := prefix + strconv.Itoa(i)
		msgs = append(msgs, kafka.Message{Partition: i % w.parts(), Key: []byte(id), Value: []byte("v" + id),
			Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}})
	}
	w.kafka.Produce(w.t, w.topic, msgs...)
}

func (w *world) parts() int {
	ps, err := kafkaPartitions(w)
	require.NoError(w.t, err)
	return ps
}

func kafkaPartitions(w *world) (int, error) {
	conn, err := kafka.Dial("tcp", w.kafka.Brokers[0])
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ps, err := conn.ReadPartitions(w.topic)
	return len(ps), err
}

// consume runs a consumer with handler h (nil: one effect row per message)
// until every partition's stored position reaches want, then stops it.
func (w *world) consume(h consumer.HandlerFunc, want int64) {
	w.t.Helper()
	w.consumeWith(func(cfg *consumer.Config) {
		if h != nil {
			cfg.Handler = h
		}
	}, want)
}

// logEnd is the end of the partition's log.
func (w *world) logEnd(partition int) int64 {
	w.t.Helper()
	admin, err := kafkaadmin.New(kafkaclient.Config{Brokers: w.kafka.Brokers})
	require.NoError(w.t, err)
	defer admin.Close()
	b, err := admin.LogBounds(context.Background(), w.topic, []int{partition})
	require.NoError(w.t, err)
	return b[partition].End
}

func (w *world) minPosition() int64 {
	n := w.parts()
	got := w.db.Int(w.t, `SELECT count(*) FROM `+w.db.Table("consumer_offsets")+` WHERE consumer = $1`, w.name)
	if got < int64(n) {
		return -1
	}
	return w.db.Int(w.t, `SELECT min(next_offset) FROM `+w.db.Table("consumer_offsets")+` WHERE consumer = $1`, w.name)
}

func (w *world) requireEffectsOnce(n int) {
	w.t.Helper()
	require.EqualValues(w.t, n, w.db.Int(w.t, `SELECT count(*) FROM `+w.db.Table("effects")))
	require.EqualValues(w.t, n, w.db.Int(w.t, `SELECT count(DISTINCT message_id) FROM `+w.db.Table("effects")))
}

// golden compares text with testdata/name, after replacing the test's
// random names.
func (w *world) golden(name, text string) {
	w.t.Helper()
	for from, to := range map[string]string{w.db.Schema: "SCHEMA", w.topic: "TOPIC", w.name: "CONSUMER"} {
		if from != "" {
			text = strings.ReplaceAll(text, from, to)
		}
	}
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(w.t, os.WriteFile(path, []byte(text), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(w.t, err, "run go test ./cmd/kafkaonce -update to create it")
	require.Equal(w.t, string(want), text)
}

func TestMigrateTwice(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	w := &world{t: t, db: db}
	out, errOut, code := w.cli("migrate")
	require.Equal(t, 0, code, errOut)
	w.golden("migrate_first", out)
	out, _, code = w.cli("migrate")
	require.Equal(t, 0, code)
	w.golden("migrate_again", out)
}

func TestStatusShowsEachPartition(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 3)
	w.produce(30, "s")
	w.consume(nil, 10)
	w.produce(3, "late") // not consumed: lag 1 per partition

	out, errOut, code := w.cli("status", "--consumer", w.name, "--json")
	require.Equal(t, 0, code, errOut)
	var r statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 30, r.Claims.Total)
	require.Len(t, r.Partitions, 3)
	for _, p := range r.Partitions {
		require.EqualValues(t, 10, p.Stored)
		require.EqualValues(t, 11, p.LogEnd)
		require.EqualValues(t, 1, p.Lag)
	}
	out, _, code = w.cli("status", "--consumer", w.name)
	require.Equal(t, 0, code)
	require.Contains(t, out, "TOPIC")
	require.Contains(t, out, "total lag: 3")
}

// Messages set aside to be retried later are not dead letters: status and
// the page count them apart, waiting with the time the next is due.
func TestStatusTellsRetriesFromDeadLetters(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(5, "r")
	w.consume(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch m.ID {
		case "r0", "r1", "r2":
			return consumer.RetryLater(errors.New("partner down"), time.Hour)
		case "r3":
			return consumer.Permanent(errors.New("malformed"))
		}
		return nil
	}, 5)

	out, errOut, code := w.cli("status", "--consumer", w.name, "--json")
	require.Equal(t, 0, code, errOut)
	var r statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 1, r.DeadLetters, "only the permanent failure is a dead letter")
	require.EqualValues(t, 1, r.Pending)
	require.EqualValues(t, 3, r.Retries.Waiting)
	require.WithinDuration(t, time.Now().Add(time.Hour), r.Retries.NextDue, time.Minute)

	out, _, code = w.cli("status", "--consumer", w.name)
	require.Equal(t, 0, code)
	require.Contains(t, out, "dead letters: 1 (1 open: neither redriven nor settled)")
	require.Contains(t, out, "set aside to retry later: 3 waiting, next due at "+r.Retries.NextDue.UTC().Format(time.RFC3339)+", 0 applied on a retry")

	srv := w.servePage(w.env(), serveOptions{})
	_, body := get(t, srv, "/")
	require.Contains(t, body, "dead letters 1 (1 open); set aside to retry later 3 waiting, next due ")
	require.Contains(t, body, "<td>retry_later</td><td class=\"n\">3</td><td class=\"n\">3</td><td class=\"n\">3</td>")
}

// status reads Postgres and Kafka. What Kafka cannot give (a topic it does
// not have, a cluster that does not answer) is named with why, the rest is
// shown as Postgres holds it, and the exit code is 1.
func TestStatusWithoutKafkaShowsWhatPostgresHolds(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(20, "s")
	w.consume(nil, 10)
	status := func(t *testing.T, env map[string]string, args ...string) (statusReport, string) {
		t.Helper()
		args = append([]string{"status", "--consumer", w.name}, args...)
		out, errOut, code := w.cliWith(env, append(args, "--json")...)
		require.Equal(t, 1, code, out+errOut)
		var r statusReport
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		require.EqualValues(t, 20, r.Claims.Total, "the claims, from Postgres")
		require.Zero(t, r.DeadLetters)
		text, errOut, code := w.cliWith(env, args...)
		require.Equal(t, 1, code, text+errOut)
		require.NotContains(t, errOut, "kafkaonce: kafka:", "said on stdout, with the rest")
		require.Contains(t, text, "claims: 20 (applied 20")
		require.Contains(t, text, "dead letters: 0")
		require.Contains(t, text, "idempotency keys (HTTP, whole schema): 0")
		return r, text
	}
	requireStoredOnly := func(t *testing.T, r statusReport) {
		t.Helper()
		require.Len(t, r.Partitions, 2, "the partitions with stored positions")
		for _, p := range r.Partitions {
			require.Equal(t, w.topic, p.Topic)
			require.EqualValues(t, 10, p.Stored)
			require.NotNil(t, p.LastCommit)
			require.EqualValues(t, -1, p.LogStart, "not read")
			require.EqualValues(t, -1, p.LogEnd, "not read")
			require.EqualValues(t, -1, p.Committed, "not read")
			require.EqualValues(t, -1, p.Lag, "unknown without the log end")
		}
	}
	env := map[string]string{"DATABASE_URL": w.db.URL, "KAFKA_BROKERS": strings.Join(w.kafka.Brokers, ",")}

	t.Run("a topic Kafka does not have is named, the others are read", func(t *testing.T) {
		gone := testenv.Name(t, "gone")
		r, text := status(t, env, "--topic", gone)
		require.Equal(t, []kafkaUnread{{Topic: gone, NotRead: []string{"partitions", "log_bounds", "committed_offsets"},
			Error: "kafka: topic " + gone + " does not exist"}}, r.KafkaUnread)
		require.Len(t, r.Partitions, 2, "the consumer's own topic, read in full")
		for _, p := range r.Partitions {
			require.Equal(t, w.topic, p.Topic)
			require.EqualValues(t, 10, p.Stored)
			require.EqualValues(t, 10, p.LogEnd)
			require.Zero(t, p.Lag)
		}
		require.Contains(t, text, "total lag: 0\n")
		require.Contains(t, text, "KAFKA NOT READ for topic "+gone+": its partitions, log bounds and the committed offsets of group "+w.name+
			" (kafka: topic "+gone+" does not exist)")
	})

	t.Run("a Kafka that does not answer", func(t *testing.T) {
		down := map[string]string{"DATABASE_URL": w.db.URL, "KAFKA_BROKERS": blackhole(t)}
		r, text := status(t, down)
		requireStoredOnly(t, r)
		require.Len(t, r.KafkaUnread, 1)
		require.Equal(t, w.topic, r.KafkaUnread[0].Topic)
		require.Equal(t, []string{"partitions", "log_bounds", "committed_offsets"}, r.KafkaUnread[0].NotRead)
		require.Contains(t, r.KafkaUnread[0].Error, "kafka: metadata of "+w.topic)
		require.Contains(t, r.KafkaUnread[0].Error, "cannot connect to the brokers: the broker did not answer in time")
		require.Contains(t, text, "KAFKA NOT READ for topic "+w.topic+": its partitions, log bounds and the committed offsets of group "+w.name+" (kafka: metadata of "+w.topic)
		require.Contains(t, text, "total lag: unknown")
		require.Regexp(t, `(?m)^`+w.topic+` +0 +- +- +- +10 +- `, text, "the stored position, and - for what Kafka did not give")
	})

	t.Run("the consumer's topic deleted", func(t *testing.T) {
		res, err := kadm.NewClient(w.kafka.Client(t)).DeleteTopics(context.Background(), w.topic)
		require.NoError(t, err)
		require.NoError(t, res.Error())
		r, text := status(t, env)
		requireStoredOnly(t, r)
		require.Equal(t, []kafkaUnread{{Topic: w.topic, NotRead: []string{"partitions", "log_bounds", "committed_offsets"},
			Error: "kafka: topic " + w.topic + " does not exist"}}, r.KafkaUnread)
		require.Contains(t, text, "KAFKA NOT READ for topic "+w.topic+": its partitions, log bounds and the committed offsets of group "+w.name+
			" (kafka: topic "+w.topic+" does not exist)")
	})
}

// A transaction that lost a race for rows shows in its partition's row:
// the retry counted, the batch size since (shrunk, and growing back).
func TestStatusShowsContention(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(20, "s")
	var lost atomic.Bool
	w.consume(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "s4" && !lost.Swap(true) {
			return &pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected"}
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+w.db.Table("effects")+` VALUES ($1)`, m.ID)
		return err
	}, 10)

	out, errOut, code := w.cli("status", "--consumer", w.name, "--json")
	require.Equal(t, 0, code, errOut)
	var r statusReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	contended := 0
	for _, p := range r.Partitions {
		if p.ContentionRetries == 0 {
			require.Nil(t, p.BatchLimit, "partition %d never met contention: its batches are MaxBatch", p.Partition)
			continue
		}
		contended++
		require.EqualValues(t, 1, p.ContentionRetries)
		require.NotNil(t, p.BatchLimit)
		require.Less(t, *p.BatchLimit, consumer.DefaultMaxBatch, "shrunk, and growing back")
		require.NotNil(t, p.LastContention)
	}
	require.Equal(t, 1, contended, "one partition lost one race")
	out, _, code = w.cli("status", "--consumer", w.name)
	require.Equal(t, 0, code)
	require.Contains(t, out, "CONTENTION RETRIES")
	require.Contains(t, out, "contention: transactions lost races for rows")
}

func TestAuditFlagsADeletedClaim(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(20, "a")
	w.consume(nil, 10)

	out, errOut, code := w.cli("audit", "--consumer", w.name, "--topic", w.topic)
	require.Equal(t, 0, code, out+errOut)
	w.golden("audit_ok", out)

	// Someone deletes a claim by hand.
	w.db.Exec(t, `DELETE FROM `+w.db.Table("processed_messages")+` WHERE message_id = 'a7'`)
	out, _, code = w.cli("audit", "--consumer", w.name, "--topic", w.topic)
	require.Equal(t, 1, code, out)
	w.golden("audit_deleted_claim", out)

	out, _, code = w.cli("audit", "--consumer", w.name, "--topic", w.topic, "--json")
	require.Equal(t, 1, code)
	var r auditReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 1, r.Total.WouldReapply)
	require.Equal(t, "a7", r.Findings[0].MessageID)
	require.False(t, r.OK)
}

func TestPruneThenRewindAppliesNothingTwice(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(20, "p")
	w.consume(nil, 10)

	_, errOut, code := w.cli("prune", "--consumer", w.name, "--older-than", "1h")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "shorter than the minimum")

	out, _, code := w.cli("prune", "--consumer", w.name, "--older-than", "0s", "--force", "--dry-run")
	require.Equal(t, 0, code)
	require.Contains(t, out, "20 claims older than")
	out, errOut, code = w.cli("prune", "--consumer", w.name, "--older-than", "0s", "--force", "--batch", "7")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "deleted 20 claims")
	require.Zero(t, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("processed_messages")))

	// The audit sees the pruned claims as covered by the stored positions.
	out, _, code = w.cli("audit", "--consumer", w.name, "--topic", w.topic, "--retention", "0s", "--json")
	require.Equal(t, 0, code, out)
	var r auditReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 20, r.Total.Pruned)

	// Rewind and replay: nothing is applied twice.
	out, errOut, code = w.cli("replay", "--consumer", w.name, "--topic", w.topic, "--to", "earliest", "--yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "20 messages will be read again and skipped")
	w.produce(4, "q")
	w.consume(nil, 12)
	w.requireEffectsOnce(24)
}

func TestReplayRefusesWhileMembersAreActive(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(3, "r")
	c, err := consumer.New(w.db.Pool, &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic},
		Schema: w.db.Schema, SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for w.minPosition() < 3 {
		time.Sleep(50 * time.Millisecond)
	}
	out, errOut, code := w.cli("replay", "--consumer", w.name, "--topic", w.topic, "--yes")
	require.Equal(t, 2, code, out)
	require.Contains(t, errOut, "1 active member")
	require.Contains(t, out, "REWIND TO")

	_, errOut, code = w.cli("replay", "--consumer", w.name, "--topic", w.topic)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "active member")
}

func TestDeadLettersListShowRedrive(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(3, "d")
	var fixed atomic.Bool
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "d1" && !fixed.Load() {
			return consumer.Permanent(errors.New("partner said no"))
		}
		_, err := tx.Exec(ctx, `INSERT INTO `+w.db.Table("effects")+` VALUES ($1)`, m.ID)
		return err
	}
	w.consume(h, 3)

	out, errOut, code := w.cli("dead-letters", "list", "--consumer", w.name)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, w.topic+"/0/1")
	require.Contains(t, out, "permanent")
	require.Contains(t, out, "pending")
	var letters []struct{ ID int64 }
	out, _, _ = w.cli("dead-letters", "list", "--consumer", w.name, "--json")
	require.NoError(t, json.Unmarshal([]byte(out), &letters))
	require.Len(t, letters, 1)
	id := strconv.FormatInt(letters[0].ID, 10)

	out, _, code = w.cli("dead-letters", "show", id)
	require.Equal(t, 0, code)
	require.Contains(t, out, `value:         "vd1"`)
	require.Contains(t, out, "header:        message-id = \"d1\"")
	require.Contains(t, out, "partner said no")

	_, errOut, code = w.cli("dead-letters", "redrive", "--consumer", w.name)
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--all")

	// The running consumer performs the redrive.
	fixed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	c, err := consumer.New(w.db.Pool, &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic},
		Schema: w.db.Schema, Handler: consumer.HandlerFunc(h), SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	out, errOut, code = w.cli("dead-letters", "redrive", "--consumer", w.name, "--wait", id)
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, out, "requested a redrive of 1 letter")
	require.Contains(t, out, id+"\tredriven")
	w.requireEffectsOnce(3)
}

// The page's own canary test is TestServeNeverShowsSecrets.
func TestPasswordsAreNeverPrinted(t *testing.T) {
	t.Parallel()
	w := &world{t: t, db: testenv.NewEmptyDB(t)}
	const canary = "canary-s3cret-4711"
	for _, url := range []string{
		"postgres://ledger:" + canary + "@127.0.0.1:1/db?connect_timeout=2",
		"host=127.0.0.1 port=1 user=ledger password=" + canary + " connect_timeout=2",
		"postgres://ledger:" + canary + "@[::1:bad",
	} {
		for _, args := range [][]string{{"status", "--consumer", "c"}, {"serve", "--listen", "127.0.0.1:0"}} {
			out, errOut, code := w.cliWith(map[string]string{"DATABASE_URL": url, "KAFKA_PASSWORD": canary}, args...)
			require.Equal(t, 2, code)
			require.NotContains(t, out+errOut, canary, "url form %q, %s", url, args[0])
			require.NotEmpty(t, errOut)
		}
	}
}

func TestReplayForwardSkipsForGood(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(10, "f")
	w.consume(nil, 10)
	w.produce(10, "g") // offsets 10..19, not consumed yet
	out, errOut, code := w.cli("replay", "--consumer", w.name, "--topic", w.topic, "--to", "15", "--yes")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "5 messages between the stored positions and the target will never be processed")
	w.consume(nil, 20)
	w.requireEffectsOnce(15) // g0..g4 skipped on purpose
	require.Zero(t, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("effects")+` WHERE message_id IN ('g0','g1','g2','g3','g4')`))
}

// The replay plan counts messages as the consumer is handed them, not
// offsets: a transactional producer's commit markers and aborted records
// take offsets that no handler ever sees.
func TestReplayPlanCountsMessagesNotOffsets(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	tx, err := kgo.NewClient(kgo.SeedBrokers(w.kafka.Brokers...), kgo.TransactionalID(testenv.Name(t, "tx")), kgo.DefaultProduceTopic(w.topic))
	require.NoError(t, err)
	defer tx.Close()
	inTransaction := func(commit bool, ids ...string) {
		require.NoError(t, tx.BeginTransaction())
		for _, id := range ids {
			require.NoError(t, tx.ProduceSync(context.Background(), &kgo.Record{Value: []byte(id), Headers: []kgo.RecordHeader{{Key: "message-id", Value: []byte(id)}}}).FirstErr())
		}
		require.NoError(t, tx.EndTransaction(context.Background(), kgo.TransactionEndTry(commit)))
	}
	inTransaction(true, "c0", "c1", "c2")        // offsets 0-2, marker 3
	inTransaction(false, "a0", "a1", "a2", "a3") // offsets 4-7 aborted, marker 8
	inTransaction(true, "d0", "d1")              // offsets 9-10, marker 11
	waitUntil(t, time.Minute, "the markers in the log", func() bool { return w.logEnd(0) == 12 })
	w.consume(nil, 12) // past the last marker

	out, errOut, code := w.cli("replay", "--consumer", w.name, "--to", "earliest", "--dry-run", "--json")
	require.Equal(t, 0, code, out+errOut)
	var p replayPlan
	require.NoError(t, json.Unmarshal([]byte(out), &p))
	require.Len(t, p.Partitions, 1)
	rp := p.Partitions[0]
	require.EqualValues(t, 5, rp.Skipped, "the five committed messages, not the twelve offsets")
	require.Zero(t, rp.New+rp.SkippedByClaim+rp.Conflicts+rp.Unread, "%+v", rp)
	text, errOut, code := w.cli("replay", "--consumer", w.name, "--to", "earliest", "--dry-run")
	require.Equal(t, 0, code, text+errOut)
	require.Contains(t, text, "5 messages will be read again and skipped without calling the handler: 5 below the stored positions, 0 already claimed (applied, or set aside); 0 are new")

	t.Run("a replay from the stored positions reads nothing again", func(t *testing.T) {
		out, errOut, code := w.cli("replay", "--consumer", w.name, "--to", "12", "--dry-run")
		require.Equal(t, 0, code, out+errOut)
		require.Contains(t, out, "0 messages will be read again and skipped without calling the handler: 0 below the stored positions, 0 already claimed (applied, or set aside); 0 are new")
	})
}

// The replay plan counts claims, as the audit does: a message past the
// stored position whose id is claimed is read again and skipped, not new.
// After offsets.Store.Forget there is no position, and only the claims
// tell what is new.
func TestReplayPlanCountsClaimsPastTheStoredPosition(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 2)
	w.produce(20, "p") // p0, p2, ... on partition 0; p1, p3, ... on 1
	w.consume(nil, 10)
	w.produce(4, "q") // offsets 10 and 11 of each partition: new
	msg := func(partition int, id, value string) kafka.Message {
		return kafka.Message{Partition: partition, Key: []byte(id), Value: []byte(value), Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}}
	}
	// Offset 12 of each partition: a producer's re-send of p0, and another
	// message under p1's id.
	w.kafka.Produce(t, w.topic, msg(0, "p0", "vp0"), msg(1, "p1", "other"))
	plan := func(t *testing.T) (replayPlan, string) {
		t.Helper()
		out, errOut, code := w.cli("replay", "--consumer", w.name, "--to", "earliest", "--dry-run", "--json")
		require.Equal(t, 0, code, out+errOut)
		var p replayPlan
		require.NoError(t, json.Unmarshal([]byte(out), &p))
		require.Equal(t, "header:message-id, as the consumer records", p.ClaimsCountedBy)
		require.Empty(t, p.ClaimsNotCounted)
		text, errOut, code := w.cli("replay", "--consumer", w.name, "--to", "earliest", "--dry-run")
		require.Equal(t, 0, code, text+errOut)
		require.Contains(t, text, "WARNING: 1 messages have an id claimed for other content")
		return p, text
	}
	type counts struct{ position, claim, conflicts, fresh int64 }
	countsOf := func(p replayPlan) []counts {
		var cs []counts
		for _, rp := range p.Partitions {
			cs = append(cs, counts{rp.Skipped, rp.SkippedByClaim, rp.Conflicts, rp.New})
		}
		return cs
	}

	t.Run("with stored positions, a re-send past them is skipped by its claim", func(t *testing.T) {
		p, text := plan(t)
		require.Equal(t, []counts{{10, 1, 0, 2}, {10, 0, 1, 2}}, countsOf(p))
		require.Contains(t, text, "21 messages will be read again and skipped without calling the handler: 20 below the stored positions, 1 already claimed (applied, or set aside); 4 are new")
	})

	positions, err := offsets.NewStore(w.db.Schema)
	require.NoError(t, err)
	_, err = positions.Forget(context.Background(), w.db.Pool, w.name, w.topic)
	require.NoError(t, err)

	t.Run("after Forget, the claims tell what is new", func(t *testing.T) {
		p, text := plan(t)
		require.Equal(t, []counts{{0, 11, 0, 2}, {0, 10, 1, 2}}, countsOf(p))
		require.Contains(t, text, "21 messages will be read again and skipped without calling the handler: 0 below the stored positions, 21 already claimed (applied, or set aside); 4 are new")
	})

	t.Run("the replay applies what the plan called new, and nothing twice", func(t *testing.T) {
		out, errOut, code := w.cli("replay", "--consumer", w.name, "--to", "earliest", "--yes")
		require.Equal(t, 0, code, out+errOut)
		w.consume(nil, 13)
		w.requireEffectsOnce(24)
		require.EqualValues(t, 1, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("dead_letters")+` WHERE error_class = 'conflict'`))
	})
}

// A letter only accounts for the message it holds: after a topic is
// re-created and its positions reset, a letter of the old topic's message
// at an offset says nothing about the new message there.
func TestAuditDoesNotTakeALetterOfAnotherMessageAtTheOffsetForItsOwn(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.kafka.Produce(t, w.topic,
		kafka.Message{Key: []byte("a0"), Value: []byte("va0"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("a0")}}},
		kafka.Message{Key: []byte("k"), Value: []byte("no id, new topic")},
		kafka.Message{Key: []byte("a2"), Value: []byte("va2"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("a2")}}})
	w.consume(nil, 3)
	out, errOut, code := w.cli("audit", "--consumer", w.name, "--topic", w.topic, "--json")
	require.Equal(t, 0, code, out+errOut)
	var r auditReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 1, r.Total.DeadLettered, "the message without an id is set aside")

	// Its letter is replaced by a letter of another message at the same
	// offset: the message is now neither applied nor set aside.
	w.db.Exec(t, `UPDATE `+w.db.Table("dead_letters")+` SET message_value = 'no id, old topic'::bytea WHERE consumer = $1`, w.name)
	out, _, code = w.cli("audit", "--consumer", w.name, "--topic", w.topic, "--json")
	require.Equal(t, 1, code, out)
	r = auditReport{}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 0, r.Total.DeadLettered)
	require.EqualValues(t, 1, r.Total.Missing)
	require.EqualValues(t, 1, r.Findings[0].Offset)
}

func TestKeysGetStatusAndPrune(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	keys := w.db.Table("idempotency_keys")
	w.db.Exec(t, `INSERT INTO `+keys+` (scope, idem_key, method, route, fingerprint, status, headers, body, expires_at) VALUES
		('alice', 'pay-1', 'POST', '/v1/payments', '\xab', 201, convert_to('Content-Type: application/json'||E'\n', 'UTF8'), '{"id":7}', now() + interval '1 day'),
		('alice', 'pay-0', 'POST', '/v1/payments', '\xab', 201, '', '{"id":6}', now() - interval '1 minute')`)
	// A phased request's run, stalled at "charge" a day past its expiry:
	// shown, counted, never pruned.
	w.db.Exec(t, `INSERT INTO `+keys+` (scope, idem_key, method, route, fingerprint, flow, run_id, recovery_point,
			lease_token, lease_until, taken, last_error, expires_at)
		VALUES ('alice', 'pay-2', 'POST', '/v1/payments', '\xab', 'payments', 'r', 'charge', 't', now() - interval '1 minute', 2,
			'provider: 503', now() - interval '1 day')`)
	// A run given up after its provider kept failing: complete, with its
	// history.
	w.db.Exec(t, `INSERT INTO `+keys+` (scope, idem_key, method, route, fingerprint, status, headers, body, flow, run_id,
			taken, last_error, last_error_at, given_up_at, give_up_reason, expires_at)
		VALUES ('alice', 'pay-3', 'POST', '/v1/payments', '\xab', 424, '\x01', '{}', 'payments', 'r3', 11,
			'provider: 503', '2026-01-02T03:04:05Z', '2026-01-02T03:05:00Z', 'taken 11 times, more than the flow''s MaxTakes (10)', now() + interval '1 day')`)

	out, errOut, code := w.cli("keys", "get", "--scope", "alice", "pay-1")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "request:  POST /v1/payments")
	require.Contains(t, out, "status:   201")
	require.Contains(t, out, "header:   Content-Type: application/json")
	require.Contains(t, out, `body:     "{\"id\":7}"`)
	out, errOut, code = w.cli("keys", "get", "--scope", "alice", "pay-2")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "phased:   flow payments, run r, taken 2 time(s)")
	require.Contains(t, out, "in progress: at recovery point charge")
	require.Contains(t, out, "lease:    ran out at")
	require.Contains(t, out, "last error: provider: 503")
	out, errOut, code = w.cli("keys", "get", "--scope", "alice", "--derive", "charge", "pay-3")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "phased:   flow payments, run r3, taken 11 time(s)")
	require.Regexp(t, `derived key "charge": [0-9a-f]{64}\n`, out)
	require.Contains(t, out, "last error at 2026-01-02T03:04:05Z: provider: 503")
	require.Contains(t, out, "given up: 2026-01-02T03:05:00Z: taken 11 times, more than the flow's MaxTakes (10)")
	require.Contains(t, out, "status:   424")
	_, errOut, code = w.cli("keys", "get", "pay-1")
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, "pass --scope", "keys are per scope, and the error says so")

	out, errOut, code = w.cli("status", "--consumer", w.name)
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "idempotency keys (HTTP, whole schema): 4 (1 expired, 1 phased runs in progress, 1 of them stalled, 1 given up)")

	out, errOut, code = w.cli("prune", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 expired idempotency keys would be deleted", "prune without --consumer covers the keys too")
	out, errOut, code = w.cli("prune", "--dry-run", "--consumer", w.name)
	require.Equal(t, 0, code, errOut)
	require.NotContains(t, out, "idempotency keys", "keys belong to no consumer")
	out, errOut, code = w.cli("keys", "prune", "--dry-run")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "1 expired idempotency keys would be deleted")
	out, errOut, code = w.cli("keys", "prune")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "deleted 1 expired idempotency keys")
	require.EqualValues(t, 3, w.db.Int(t, `SELECT count(*) FROM `+keys), "the live keys and the run are kept")
}

// waitForLockWait returns once a statement on the schema's table waits for
// a lock, as the command's does behind the test's transaction.
func (w *world) waitForLockWait(table string) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for w.db.LockWaits(w.t, table) == 0 {
		require.True(w.t, time.Now().Before(deadline), "the command never waited for the lock")
		time.Sleep(20 * time.Millisecond)
	}
}

// cliResult is what a command run in the background said.
type cliResult struct {
	out, errOut string
	code        int
}

// cliWhileHoldingPositions runs a command while the test holds the rows of
// the consumer's stored positions, as a consumer's batch transaction does;
// once the command waits for them, it moves them (set: an UPDATE's SET
// clause) and lets go.
func (w *world) cliWhileHoldingPositions(set string, args ...string) cliResult {
	w.t.Helper()
	ctx := context.Background()
	tx, err := w.db.Pool.Begin(ctx)
	require.NoError(w.t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT next_offset FROM `+w.db.Table("consumer_offsets")+` WHERE consumer = $1 FOR UPDATE`, w.name)
	require.NoError(w.t, err)
	done := make(chan cliResult, 1)
	go func() {
		var r cliResult
		r.out, r.errOut, r.code = w.cli(args...)
		done <- r
	}()
	w.waitForLockWait("consumer_offsets")
	_, err = tx.Exec(ctx, `UPDATE `+w.db.Table("consumer_offsets")+` `+set+` WHERE consumer = $1`, w.name)
	require.NoError(w.t, err)
	require.NoError(w.t, tx.Commit(ctx))
	return <-done
}

// A consumer that moves the stored position between the replay's plan and
// its reset keeps its position: the reset is conditional on what the plan
// read, and the command fails before it touches Kafka. The test holds the
// position's row, as a consumer's batch transaction does, until the
// replay's reset waits for it, then moves it.
func TestReplayDoesNotMoveBackAPositionMovedSinceThePlan(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(10, "f")
	w.consume(nil, 10)
	w.produce(10, "g") // offsets 10..19; the plan reads the position 10
	committed := w.kafka.CommittedOffsets(t, w.name, w.topic, 1)

	r := w.cliWhileHoldingPositions(`SET next_offset = 18`,
		"replay", "--consumer", w.name, "--topic", w.topic, "--to", "15", "--yes", "--force")
	require.EqualValues(t, 18, w.minPosition(), "the position moved by the consumer is kept")
	require.Equal(t, 2, r.code, r.out+r.errOut)
	require.Contains(t, r.errOut, "moved from 10 to 18")
	require.Contains(t, r.errOut, "nothing changed")
	require.Equal(t, committed, w.kafka.CommittedOffsets(t, w.name, w.topic, 1), "Kafka's offsets are untouched")
}

// A replay that Kafka refuses (the group has an active member, and --force
// tried anyway) leaves the stored positions as they were.
func TestReplayRefusedByKafkaMovesNoPosition(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(10, "f")
	w.consume(nil, 10)
	w.produce(10, "g")
	committed := w.kafka.CommittedOffsets(t, w.name, w.topic, 1)

	member := kafka.NewReader(kafka.ReaderConfig{Brokers: w.kafka.Brokers, GroupID: w.name, Topic: w.topic,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond})
	defer member.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		state, _ := w.kafka.GroupState(w.name)
		if state == "Stable" {
			break
		}
		require.True(t, time.Now().Before(deadline), "the member never joined (%s)", state)
		time.Sleep(50 * time.Millisecond)
	}

	out, errOut, code := w.cli("replay", "--consumer", w.name, "--topic", w.topic, "--to", "15", "--yes", "--force")
	require.EqualValues(t, 10, w.minPosition(), "the stored position did not move forward")
	require.Equal(t, 2, code, out+errOut)
	require.Contains(t, out, "1 active members")
	require.Contains(t, errOut, "nothing changed")
	require.Equal(t, committed, w.kafka.CommittedOffsets(t, w.name, w.topic, 1))
}

// The failure of a redrive answers the request it was started for: a
// request made while it ran stays pending, with no error, for an attempt of
// its own. The test holds the letter's row, so the attempt waits after it
// read the first request, and makes the second request meanwhile.
func TestALateRedriveFailureKeepsANewerRequest(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(3, "d")
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "d1" {
			return consumer.Permanent(errors.New("partner said no"))
		}
		return nil
	}
	w.consume(h, 3)
	letters := w.db.Table("dead_letters")
	id := strconv.FormatInt(w.db.Int(t, `SELECT id FROM `+letters+` WHERE consumer = $1`, w.name), 10)
	out, errOut, code := w.cli("dead-letters", "redrive", "--consumer", w.name, id)
	require.Equal(t, 0, code, out+errOut)

	ctx := context.Background()
	tx, err := w.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT id FROM `+letters+` WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)

	c, err := consumer.New(w.db.Pool, &consumer.Config{Name: w.name, Brokers: w.kafka.Brokers, Topics: []string{w.topic},
		Schema: w.db.Schema, Handler: consumer.HandlerFunc(h), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	type result struct {
		res consumer.RedriveResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Redrive(ctx, consumer.RedriveFilter{Requested: true})
		done <- result{res, err}
	}()
	w.waitForLockWait("dead_letters") // the attempt read the first request
	store, err := deadletter.NewStore(w.db.Schema)
	require.NoError(t, err)
	letterID, err := strconv.ParseInt(id, 10, 64)
	require.NoError(t, err)
	n, err := store.RequestRedrive(ctx, tx, w.name, []int64{letterID})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, tx.Commit(ctx))

	r := <-done
	require.NoError(t, r.err)
	require.Len(t, r.res.Failed, 1)
	require.EqualValues(t, 1, w.db.Int(t, `SELECT count(*) FROM `+letters+` WHERE id = $1 AND redrive_requested_at IS NOT NULL AND redrive_error IS NULL`, id),
		"the newer request is still pending")
}

// An audit that could not read part of its range says so and exits with 2,
// never OK: here retention deletes offsets after the audit read the log's
// bounds and before it read the partition. The test holds consumer_offsets,
// which the audit reads between the two, until it waits for it.
func TestAuditThatDidNotReadEverythingIsNoVerdict(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(10, "a")
	w.consume(nil, 10)

	ctx := context.Background()
	tx, err := w.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `LOCK TABLE `+w.db.Table("consumer_offsets")+` IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	type result struct {
		out, errOut string
		code        int
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, code := w.cli("audit", "--consumer", w.name, "--topic", w.topic)
		done <- result{out, errOut, code}
	}()
	w.waitForLockWait("consumer_offsets")
	w.kafka.DeleteRecordsBefore(t, w.topic, 0, 4)
	require.NoError(t, tx.Commit(ctx))

	r := <-done
	require.NotContains(t, r.out, "OK:")
	require.Equal(t, 2, r.code, r.out+r.errOut)
	require.Contains(t, r.out, "INCOMPLETE: 4 offsets of the range were not read")
	require.Contains(t, r.errOut, "4 offsets below 4 were deleted (retention) before they were read")
}

// Pruning deletes claims by when they were processed, not by the message's
// own time: an old message processed recently (a consumer that lagged for
// days) has a claim no prune deleted, so a missing one is a problem.
func TestAuditTellsPrunedFromMissingByProcessingTime(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	old := time.Now().Add(-10 * 24 * time.Hour)
	var msgs []kafka.Message
	for i := range 10 {
		id := "o" + strconv.Itoa(i)
		msgs = append(msgs, kafka.Message{Key: []byte(id), Value: []byte("v" + id), Time: old,
			Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}})
	}
	w.kafka.Produce(t, w.topic, msgs...)
	w.consume(nil, 10) // processed now, 10 days after they were written
	w.db.Exec(t, `DELETE FROM `+w.db.Table("processed_messages")+` WHERE message_id = 'o5'`)

	out, _, code := w.cli("audit", "--consumer", w.name, "--topic", w.topic, "--retention", "7d", "--json")
	var r auditReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 1, r.Total.WouldReapply, "o5 was processed after o0..o4, today: no 7-day prune deleted its claim")
	require.EqualValues(t, 0, r.Total.Pruned)
	require.Equal(t, 1, code)

	// Pruned for real, every claim is covered by the position.
	out, errOut, code := w.cli("prune", "--consumer", w.name, "--older-than", "0s", "--force")
	require.Equal(t, 0, code, out+errOut)
	out, _, code = w.cli("audit", "--consumer", w.name, "--topic", w.topic, "--retention", "0s", "--json")
	r = auditReport{}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 10, r.Total.Pruned)
	require.Equal(t, 0, code, out)
}

// topic-recreated starts a position-id consumer afresh on its topic: the
// positions go back to 0 and the old claims are retired under a new name
// (the procedure end to end is consumer's
// TestATopicRecreatedByTheProcedureIsAppliedAfresh); run on a topic that
// was not re-created (every position counts in it), it changes nothing;
// it says which flag is missing.
func TestTopicRecreatedRetiresThePositionIDs(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(3, "m")
	w.consumeWith(func(cfg *consumer.Config) { cfg.MessageID = consumer.IDFromPosition() }, 3)

	out, errOut, code := w.cli("topic-recreated", "--consumer", w.name, "--topic", w.topic, "--partitions", "1", "--json")
	require.Equal(t, 0, code, out+errOut)
	var same topicRecreatedReport
	require.NoError(t, json.Unmarshal([]byte(out), &same))
	require.Equal(t, topicRecreatedReport{Consumer: w.name, Topic: w.topic, Suffix: same.Suffix, Kept: 1}, same, "the topic was not re-created: nothing changes")

	ctx := context.Background()
	res, err := kadm.NewClient(w.kafka.Client(t)).DeleteTopics(ctx, w.topic)
	require.NoError(t, err)
	require.NoError(t, res.Error())
	require.Eventually(t, func() bool {
		created, err := kadm.NewClient(w.kafka.Client(t)).CreateTopic(ctx, 1, 1, nil, w.topic)
		return err == nil && created.Err == nil
	}, 30*time.Second, 100*time.Millisecond, "the topic created again")
	out, errOut, code = w.cli("topic-recreated", "--consumer", w.name, "--topic", w.topic, "--partitions", "1", "--json")
	require.Equal(t, 0, code, out+errOut)
	var r topicRecreatedReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	require.EqualValues(t, 1, r.Positions)
	require.EqualValues(t, 3, r.RetiredClaims)
	require.EqualValues(t, 0, w.minPosition())
	require.EqualValues(t, 3, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("processed_messages")+` WHERE message_id LIKE $1`, w.topic+"/0/_"+r.Suffix))

	for flag, args := range map[string][]string{
		"--consumer":   {"--topic", w.topic, "--partitions", "1"},
		"--topic":      {"--consumer", w.name, "--partitions", "1"},
		"--partitions": {"--consumer", w.name, "--topic", w.topic},
	} {
		_, errOut, code := w.cli(append([]string{"topic-recreated"}, args...)...)
		require.Equal(t, 2, code, flag)
		require.Contains(t, errOut, flag+" is required", flag)
	}
}
