package devenv_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

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
func TestAdversaryRewindCommitsZeroNotTheLogStart(t *testing.T) {
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
