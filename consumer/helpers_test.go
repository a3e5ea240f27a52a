package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// env is one test's world: its own schema, topic and group.
type env struct {
	t       testing.TB
	db      *testenv.DB
	kafka   *testenv.Kafka
	topic   string
	parts   int
	group   string
	name    string
	events  *recorder
	commits *commitWatch
	// protocol is the group protocol config gives the group's members
	// (see setupProtocol).
	protocol consumer.GroupProtocol
}

func setup(t testing.TB, partitions int) *env {
	t.Helper()
	return setupOn(t, partitions, testenv.NewKafka(t))
}

// setupWithDB is setup on a pool made with opts.
func setupWithDB(t testing.TB, partitions int, opts ...testenv.DBOption) *env {
	t.Helper()
	return setupOn(t, partitions, testenv.NewKafka(t), opts...)
}

// setupOn is setup with a broker of the test's own, on a pool made with
// opts.
func setupOn(t testing.TB, partitions int, k *testenv.Kafka, opts ...testenv.DBOption) *env {
	t.Helper()
	db := testenv.NewDB(t, append([]testenv.DBOption{testenv.MaxConns(16)}, opts...)...)
	e := &env{t: t, db: db, kafka: k, topic: k.Topic(t, partitions), parts: partitions, group: k.Group(t), name: "ledger", events: &recorder{}}
	// The effect table has no unique key on purpose: a double application
	// shows up as two rows instead of an error.
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL, topic text NOT NULL, partition int NOT NULL, kafka_offset bigint NOT NULL, value text NOT NULL)`)
	e.watchCommits()
	return e
}

// applyHandler records each message as one row in effects.
func (e *env) applyHandler() consumer.Handler {
	sql := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
	return consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, sql, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
		return err
	})
}

// config returns a config for the test's topic with fast group timings,
// for a member of the test's group protocol.
func (e *env) config(h consumer.Handler) *consumer.Config {
	return e.configFor(e.protocol, h)
}

// configFor is config for a member that speaks proto, whatever the test's
// protocol: a group moving from one protocol to the other has both.
func (e *env) configFor(proto consumer.GroupProtocol, h consumer.Handler) *consumer.Config {
	cfg := &consumer.Config{
		Name:              e.name,
		KafkaClient:       kafkaClient(),
		GroupID:           e.group,
		Brokers:           e.kafka.Brokers,
		Topics:            []string{e.topic},
		Handler:           h,
		Schema:            e.db.Schema,
		MaxBatch:          100,
		Logger:            testLogger(e.t),
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		RebalanceTimeout:  10 * time.Second,
		ShutdownTimeout:   5 * time.Second,
		Retry:             consumer.RetryPolicy{InitialInterval: 10 * time.Millisecond, MaxInterval: 200 * time.Millisecond},
		Hooks:             []consumer.Hook{e.events},
		GroupProtocol:     proto,
	}
	if proto == consumer.ConsumerProtocol {
		// The group's configs (see setupProtocol).
		cfg.SessionTimeout, cfg.HeartbeatInterval = 0, 0
	}
	return cfg
}

// kafkaClient is the client the suite's consumers read with (see
// testenv.KafkaClient).
func kafkaClient() consumer.KafkaClient {
	if testenv.KafkaClient() == "kafka-go" {
		return consumer.KafkaGo
	}
	return consumer.FranzGo
}

// msg builds a message with a message-id header for a partition.
func msg(partition int, id, value string) kafka.Message {
	return kafka.Message{Partition: partition, Key: []byte(id), Value: []byte(value),
		Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
}

// produceIDs writes n messages spread over the partitions, ids "<prefix>-i".
func (e *env) produceIDs(prefix string, n int) []string {
	ids := make([]string, n)
	msgs := make([]kafka.Message, n)
	for i := range n {
		ids[i] = prefix + "-" + strconv.Itoa(i)
		msgs[i] = msg(i%e.parts, ids[i], "v-"+ids[i])
	}
	e.kafka.Produce(e.t, e.topic, msgs...)
	return ids
}

// running is a consumer running in the background.
type running struct {
	t      testing.TB
	cancel context.CancelFunc
	done   chan error
}

func (e *env) start(cfg *consumer.Config, db ...consumer.DB) *running {
	e.t.Helper()
	var pool consumer.DB = e.db.Pool
	if len(db) > 0 {
		pool = db[0]
	}
	c, err := consumer.New(pool, cfg)
	require.NoError(e.t, err)
	return e.run(c)
}

// run runs c in the background until stop, or the end of the test.
func (e *env) run(c *consumer.Consumer) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: e.t, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	e.t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels Run and requires it to return nil promptly.
func (r *running) stop() {
	r.t.Helper()
	if r.done == nil {
		return
	}
	r.cancel()
	select {
	case err := <-r.done:
		require.NoError(r.t, err)
	case <-time.After(30 * time.Second):
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		r.t.Fatalf("Run did not return within 30s of cancel; goroutines:\n%s", buf)
	}
	r.done = nil
}

func (e *env) effects() int64 {
	return e.db.Int(e.t, `SELECT count(*) FROM `+e.db.Table("effects"))
}

func (e *env) distinctEffects() int64 {
	return e.db.Int(e.t, `SELECT count(DISTINCT message_id) FROM `+e.db.Table("effects"))
}

// waitEffects waits until the effects table holds n distinct ids.
func (e *env) waitEffects(n int, timeout time.Duration) {
	e.t.Helper()
	waitFor(e.t, timeout, fmt.Sprintf("%d distinct effects", n), func() bool { return e.distinctEffects() >= int64(n) })
}

// requireExactlyOnce asserts one effect row per id, for exactly ids.
func (e *env) requireExactlyOnce(ids []string) {
	e.t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT message_id, count(*) FROM `+e.db.Table("effects")+` GROUP BY 1`)
	require.NoError(e.t, err)
	got := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(e.t, rows.Scan(&id, &n))
		got[id] = n
	}
	require.NoError(e.t, rows.Err())
	for _, id := range ids {
		require.Equalf(e.t, 1, got[id], "effects of message %s", id)
		delete(got, id)
	}
	require.Empty(e.t, got, "effects of messages that were never produced")
}

// waitCommitted waits until the group's committed offsets reach want.
func (e *env) waitCommitted(want map[int]int64, timeout time.Duration) {
	e.t.Helper()
	var got map[int]int64
	waitFor(e.t, timeout, "committed offsets", func() bool {
		got = e.kafka.CommittedOffsets(e.t, e.group, e.topic, e.parts)
		for p, off := range want {
			if got[p] != off {
				return false
			}
		}
		return true
	})
}

func (e *env) storedPositions() map[int]int64 {
	rows, err := e.db.Pool.Query(context.Background(), `SELECT partition, next_offset FROM `+e.db.Table("consumer_offsets")+` WHERE consumer = $1 AND topic = $2`, e.name, e.topic)
	require.NoError(e.t, err)
	out := map[int]int64{}
	for rows.Next() {
		var p int
		var off int64
		require.NoError(e.t, rows.Scan(&p, &off))
		out[p] = off
	}
	require.NoError(e.t, rows.Err())
	return out
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stillFor requires cond to hold throughout d: a window in which something
// must not happen.
func stillFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		require.True(t, cond(), what)
	}
}

// recorder is a hook that keeps what the consumer reported.
type recorder struct {
	mu sync.Mutex
	recorded
	// held are the contexts OnPartitionAssigned got, one per element of
	// assigned: the consumer ends one when this member stops processing
	// that partition (its generation ended, or Run returned).
	held []context.Context
}

// recorded is what a recorder saw.
type recorded struct {
	applied   int
	skipped   map[consumer.SkipReason]int
	conflicts []*consumer.FingerprintConflictError
	stopped   []*consumer.PartitionError
	assigned  []consumer.PartitionAssignment
	commits   int
	commitErr []error
}

func (r *recorder) OnMessageApplied(context.Context, *consumer.Message) {
	r.mu.Lock()
	r.applied++
	r.mu.Unlock()
}

func (r *recorder) OnMessageSkipped(_ context.Context, _ *consumer.Message, reason consumer.SkipReason) {
	r.mu.Lock()
	if r.skipped == nil {
		r.skipped = map[consumer.SkipReason]int{}
	}
	r.skipped[reason]++
	r.mu.Unlock()
}

func (r *recorder) OnFingerprintConflict(_ context.Context, err *consumer.FingerprintConflictError) {
	r.mu.Lock()
	r.conflicts = append(r.conflicts, err)
	r.mu.Unlock()
}

func (r *recorder) OnPartitionStopped(_ context.Context, err *consumer.PartitionError) {
	r.mu.Lock()
	r.stopped = append(r.stopped, err)
	r.mu.Unlock()
}

func (r *recorder) OnPartitionAssigned(ctx context.Context, a consumer.PartitionAssignment) {
	r.mu.Lock()
	r.assigned = append(r.assigned, a)
	r.held = append(r.held, ctx)
	r.mu.Unlock()
}

// assignments returns how many partition assignments the member reported,
// and how many of those it still holds (their context is not done), as of
// one moment.
func (r *recorder) assignments() (reported, holding int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ctx := range r.held {
		if ctx.Err() == nil {
			holding++
		}
	}
	return len(r.assigned), holding
}

func (r *recorder) OnOffsetsCommitted(_ context.Context, _ []consumer.TopicPartitionOffset, err error) {
	r.mu.Lock()
	r.commits++
	if err != nil {
		r.commitErr = append(r.commitErr, err)
	}
	r.mu.Unlock()
}

func (r *recorder) snapshot() recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := recorded{applied: r.applied, skipped: map[consumer.SkipReason]int{}, commits: r.commits}
	for k, v := range r.skipped {
		out.skipped[k] = v
	}
	out.conflicts = append(out.conflicts, r.conflicts...)
	out.stopped = append(out.stopped, r.stopped...)
	out.assigned = append(out.assigned, r.assigned...)
	out.commitErr = append(out.commitErr, r.commitErr...)
	return out
}

func (r *recorder) stoppedWith(target error) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.stopped {
		if errors.Is(s, target) {
			return true
		}
	}
	return false
}

// testLogger writes to the test log when -v is given and
// KAFKAONCE_TEST_LOG is set. Otherwise it keeps the last lines at INFO and
// above, and prints them if the test fails: a failure in CI comes with
// what the consumer said before it.
func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() && os.Getenv("KAFKAONCE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	tail := &logTail{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the consumer's last log lines:\n%s", tail.String())
		}
	})
	return slog.New(slog.NewTextHandler(tail, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// logTail keeps the last lines written to it; it may be written after
// the test ended, by a goroutine still stopping, when t.Log may not.
type logTail struct {
	mu    sync.Mutex
	lines []string
}

const logTailLines = 200

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == logTailLines {
		l.lines = append(l.lines[:0], l.lines[1:]...)
	}
	l.lines = append(l.lines, string(p))
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "")
}

// Names of the two ways bothWays runs a test.
var (
	handlerKinds = [2]string{"Handler", "BatchHandler"}
	batchPaths   = [2]string{"one round trip", "ClaimFirst"}
)

// bothWays runs test as two parallel subtests named by names: with
// second false, then true.
func bothWays(t *testing.T, names [2]string, test func(t *testing.T, second bool)) {
	for i, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, i == 1)
		})
	}
}

// hungDatabase is a pool over a server that accepts connections and
// never answers, as a Postgres that hangs does.
func hungDatabase(t testing.TB) *pgxpool.Pool {
	t.Helper()
	silent, err := faultproxy.StartSilent()
	require.NoError(t, err)
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+silent.Addr()+"/postgres?sslmode=disable&connect_timeout=30")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(func() { silent.Close() }) // first: the pool's pending connects fail at once
	return pool
}
