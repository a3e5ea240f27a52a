package devenv_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/offsets"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestMain(m *testing.M) { devenv.Main(m) }

func TestTheMessageIDHeaderIsTheConsumersDefault(t *testing.T) {
	if devenv.MessageIDHeader != consumer.DefaultMessageIDHeader {
		t.Fatalf("devenv.MessageIDHeader = %q, consumer.DefaultMessageIDHeader = %q", devenv.MessageIDHeader, consumer.DefaultMessageIDHeader)
	}
}

// counting counts applied and skipped messages.
type counting struct{ applied, skipped atomic.Int64 }

func (c *counting) OnMessageApplied(context.Context, *consumer.Message) { c.applied.Add(1) }
func (c *counting) OnMessageSkipped(context.Context, *consumer.Message, consumer.SkipReason) {
	c.skipped.Add(1)
}

// TestAConsumerRunsAgainstTheTestEnv is what a user's first test does:
// produce, consume, rewind, consume again, with nothing applied twice.
func TestAConsumerRunsAgainstTheTestEnv(t *testing.T) {
	var schemaName string
	t.Run("run", func(t *testing.T) {
		env := devenv.ForTest(t)
		schemaName = env.Schema
		ctx := context.Background()
		topic := env.Topic(2)
		table := pgx.Identifier{env.Schema, "credits"}.Sanitize()
		if _, err := env.Pool.Exec(ctx, `CREATE TABLE `+table+` (id text NOT NULL)`); err != nil {
			t.Fatal(err)
		}
		var msgs []devenv.Message
		for _, id := range []string{"a", "b", "c", "a"} { // "a" re-sent, as a retrying producer would
			msgs = append(msgs, devenv.Message{ID: id, Key: []byte(id), Value: []byte("1")})
		}
		if err := env.Produce(ctx, topic, msgs...); err != nil {
			t.Fatal(err)
		}
		counts := &counting{}
		cfg := &consumer.Config{Name: env.Name("credits"), Brokers: env.Brokers, Topics: []string{topic}, Schema: env.Schema,
			Hooks: []consumer.Hook{counts}, SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond,
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+table+` (id) VALUES ($1)`, m.ID)
				return err
			})}
		consumeUntil(t, env, cfg, func() bool { return counts.applied.Load()+counts.skipped.Load() >= 4 })
		if err := env.Rewind(ctx, cfg.Name, topic); err != nil {
			t.Fatal(err)
		}
		// Forget the stored positions too, so that each message of the
		// replay meets its claim and is skipped as a duplicate.
		positions, err := offsets.NewStore(env.Schema)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := positions.Forget(ctx, env.Pool, cfg.Name, topic); err != nil {
			t.Fatal(err)
		}
		skipped := counts.skipped.Load()
		consumeUntil(t, env, cfg, func() bool { return counts.skipped.Load() >= skipped+4 })
		var n int
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 3 || counts.applied.Load() != 3 {
			t.Fatalf("%d rows, %d applied; want 3 and 3 (a, b, c once each)", n, counts.applied.Load())
		}
	})
	var exists bool
	env := devenv.ForTest(t)
	if err := env.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, schemaName).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("schema %s outlived its test", schemaName)
	}
	if !strings.HasPrefix(env.Schema, "t_testaconsumerrunsagainstthetestenv_") {
		t.Errorf("schema %s is not named after the test", env.Schema)
	}
}

func consumeUntil(t *testing.T, env *devenv.TestEnv, cfg *consumer.Config, done func() bool) {
	t.Helper()
	c, err := consumer.New(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	deadline := time.Now().Add(time.Minute)
	for !done() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !done() {
		t.Fatal("the consumer did not get through the topic within a minute")
	}
}

// stops counts applied messages and stopped partitions.
type stops struct {
	applied atomic.Int64
	stopped atomic.Pointer[consumer.PartitionError]
}

func (s *stops) OnMessageApplied(context.Context, *consumer.Message) { s.applied.Add(1) }
func (s *stops) OnPartitionStopped(_ context.Context, err *consumer.PartitionError) {
	s.stopped.Store(err)
}

// Rewind says it sets the group's offsets "to the start of every
// partition of topic, as kafka-consumer-groups --reset-offsets
// --to-earliest does". It commits offset 0 instead of the log start. On a
// partition whose first messages retention already deleted, --to-earliest
// commits the log start; Rewind commits an offset below it. A consumer of
// the group with no stored position then starts at 0, kafka-go moves it
// up to the log start without a word, the consumer sees the gap, and,
// with no stored position to explain it, stops the partition with
// ErrMessagesDeleted: the messages the log still holds are never applied,
// where the same group without Rewind (or with --to-earliest) applies them.
func TestRewindCommitsZeroNotTheLogStart(t *testing.T) {
	env := devenv.ForTest(t)
	ctx := context.Background()
	topic := env.Topic(1)
	var msgs []devenv.Message
	for i := range 10 {
		id := "m" + strconv.Itoa(i)
		msgs = append(msgs, devenv.Message{ID: id, Key: []byte("k"), Value: []byte(id)})
	}
	if err := env.Produce(ctx, topic, msgs...); err != nil {
		t.Fatal(err)
	}
	// Retention removes the first five.
	cl, err := kgo.NewClient(kgo.SeedBrokers(env.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	below := kadm.Offsets{}
	below.Add(kadm.Offset{Topic: topic, Partition: 0, At: 5})
	resp, err := kadm.NewClient(cl).DeleteRecords(ctx, below)
	if err == nil {
		err = resp.Error()
	}
	cl.Close()
	if err != nil {
		t.Fatal(err)
	}

	group := env.Name("g")
	if err := env.Rewind(ctx, group, topic); err != nil {
		t.Fatal(err)
	}
	admin := testenv.Admin(t, env.Brokers)
	committed, err := admin.Committed(ctx, group, topic, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Rewind committed offset %d; the log starts at 5", committed[0])

	table := pgx.Identifier{env.Schema, "effects"}.Sanitize()
	if _, err := env.Pool.Exec(ctx, `CREATE TABLE `+table+` (id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	h := &stops{}
	c, err := consumer.New(env.Pool, &consumer.Config{Name: env.Name("c"), GroupID: group, Brokers: env.Brokers, Topics: []string{topic}, Schema: env.Schema,
		Hooks: []consumer.Hook{h}, SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, m.ID)
			return err
		})})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	deadline := time.Now().Add(30 * time.Second)
	for h.applied.Load() < 5 && h.stopped.Load() == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p := h.stopped.Load(); p != nil {
		t.Errorf("after Rewind, the group's consumer stopped its partition: %v", p)
	}
	if committed[0] != 5 {
		t.Errorf("Rewind committed offset %d; --to-earliest commits the log start, 5", committed[0])
	}
	if n := h.applied.Load(); n != 5 {
		t.Errorf("the group's next member applied %d of the 5 messages the log holds", n)
	}
}

// failedTB is a test that has failed: its cleanups run when the test says,
// and what it logs is kept.
type failedTB struct {
	testing.TB
	cleanups []func()
	logs     []string
}

func (f *failedTB) Failed() bool            { return true }
func (f *failedTB) Cleanup(fn func())       { f.cleanups = append(f.cleanups, fn) }
func (f *failedTB) Logf(s string, a ...any) { f.logs = append(f.logs, fmt.Sprintf(s, a...)) }

// A failed test keeps its schema, and says so and how to drop it.
func TestAFailedTestKeepsItsSchema(t *testing.T) {
	failed := &failedTB{TB: t}
	env := devenv.ForTest(failed)
	for i := len(failed.cleanups) - 1; i >= 0; i-- {
		failed.cleanups[i]()
	}
	var exists bool
	require.NoError(t, env.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, env.Schema).Scan(&exists))
	require.True(t, exists, "the failed test's schema was dropped")
	require.Len(t, failed.logs, 1)
	require.Contains(t, failed.logs[0], "schema "+env.Schema+" is kept for you to look at")
	require.Contains(t, failed.logs[0], "DROP SCHEMA")
	_, err := env.Pool.Exec(context.Background(), `DROP SCHEMA `+env.Schema+` CASCADE`)
	require.NoError(t, err)
}

// Close drops the schemas the program owns, unless told to keep them.
func TestCloseDropsWhatTheProgramOwns(t *testing.T) {
	ctx := context.Background()
	exists := func(env *devenv.Env, name string) bool {
		var ok bool
		require.NoError(t, env.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)`, name).Scan(&ok))
		return ok
	}
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			if keep {
				t.Setenv("KAFKAONCE_KEEP", "1")
			} else {
				t.Setenv("KAFKAONCE_KEEP", "")
			}
			env, err := devenv.Start(ctx)
			require.NoError(t, err)
			name := strings.ToLower(strings.NewReplacer("/", "_", "=", "_").Replace(t.Name()))
			_, err = env.Pool.Exec(ctx, `CREATE SCHEMA `+name)
			require.NoError(t, err)
			env.Own(name)
			probe, err := devenv.Start(ctx) // the same server when DATABASE_URL names it
			require.NoError(t, err)
			defer probe.Close()
			require.NoError(t, env.Close())
			if env.PostgresSource != "DATABASE_URL" {
				return // a throwaway server: gone with what it held
			}
			require.Equal(t, keep, exists(probe, name))
			_, _ = probe.Pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+name+` CASCADE`)
		})
	}
}
