package consumertest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// settled.done counts the hook reports of every assignment of a run, but
// takes what is due from the latest assignment's start alone. After a
// rebalance, a partition's new assignment starts at the stored position k
// (the messages below it were settled, and counted, by the first
// assignment): done then wants n-k reports and already has k, so it says
// "settled" as soon as k >= n-k, with messages k..n-1 never processed.
// runUntilSettled then stops the consumer, and ReplayTwice compares the
// tables (or, in the first run, takes the state for "before the replay").
//
// What it costs: in the replay, a handler whose ids are stable for the
// first messages and not for the last applies those last messages twice,
// and ReplayTwice compares before reaching them (passes); in the first
// run, the unprocessed messages are applied by the replay, which then
// reports a stable handler as applying messages twice.
//
// Here a member joining and leaving the group (any rebalance does) moves
// the partition once the first half of 20 messages is applied; the run is
// reported settled with the rest unprocessed.
func TestSettledCountsReportsOfAnEarlierAssignment(t *testing.T) {
	t.Parallel()
	db := testenv.NewEmptyDB(t)
	ctx := context.Background()
	_, err := consumer.Migrate(ctx, db.Pool, db.Schema)
	require.NoError(t, err)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (id text NOT NULL)`)

	broker, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	defer broker.Close()
	const topic, group, n = "settle", "settle", 20
	require.NoError(t, devenv.CreateTopic(ctx, broker.Brokers, topic, 1))
	var msgs []*consumer.Message
	for i := range n {
		msgs = append(msgs, NewMessage([]byte(strconv.Itoa(i)), WithID("m-"+strconv.Itoa(i))))
	}
	produce(t, broker.Brokers, topic, msgs)

	cfg := consumer.Config{
		Name: "settle", Schema: db.Schema, GroupID: group, Brokers: broker.Brokers, Topics: []string{topic},
		MaxBatch: 1, SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, RebalanceTimeout: 5 * time.Second,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			time.Sleep(150 * time.Millisecond)
			_, err := tx.Exec(ctx, `INSERT INTO `+db.Table("effects")+` VALUES ($1)`, m.ID)
			return err
		}),
	}

	// Another member joins once half the messages are applied, and leaves.
	intruded := make(chan struct{})
	go func() {
		defer close(intruded)
		for db.Int(t, `SELECT count(*) FROM `+db.Table("effects")) < n/2 {
			time.Sleep(20 * time.Millisecond)
		}
		g, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{ID: group, Brokers: broker.Brokers, Topics: []string{topic},
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 200 * time.Millisecond, RebalanceTimeout: 5 * time.Second})
		if err != nil {
			t.Errorf("intruder: %v", err)
			return
		}
		jctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if _, err := g.Next(jctx); err != nil {
			t.Errorf("intruder: join: %v", err)
		}
		_ = g.Close()
	}()

	runUntilSettled(t, db.Pool, cfg, map[int]int{0: n}, time.Minute, "first run")
	<-intruded
	applied := db.Int(t, `SELECT count(*) FROM `+db.Table("effects"))
	require.EqualValues(t, n, applied, "runUntilSettled reported all %d messages settled with %d applied: "+
		"the reports of the first assignment were counted against what the second assignment still had to do", n, applied)
}
