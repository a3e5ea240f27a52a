package consumer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// storedTopicIDNull reports whether partition 0's stored position has no
// topic id.
func (s *recreatedSetup) storedTopicIDNull() bool {
	return s.e.db.Int(s.t, `SELECT count(*) FROM `+s.e.db.Table("consumer_offsets")+
		` WHERE consumer = $1 AND topic = $2 AND partition = 0 AND topic_id IS NULL`, s.e.name, s.e.topic) == 1
}

// stopsOrApplies waits until the member reports the partition stopped as
// re-created, or applies one of the new topic's messages.
func (s *recreatedSetup) stopsOrApplies(rec *recorder, prefix string, n int) {
	s.t.Helper()
	waitFor(s.t, 60*time.Second, "the partition stopped as re-created, or a new message applied", func() bool {
		if rec.stoppedWith(consumer.ErrTopicRecreated) {
			return true
		}
		for _, a := range s.e.appliedOf(prefix, n) {
			if a {
				return true
			}
		}
		return false
	})
}

// A Reset while the partition is paused (a replay of its last messages)
// moves the position within the topic it counts in: the topic id stays
// stored with it, so when the topic is later deleted and re-created, the
// running member stops the partition and so does every restart.
func TestAResetWhilePausedKeepsTheTopicItCountsIn(t *testing.T) {
	t.Parallel()
	s := setupRecreated(t, consumer.StartEarliest)
	old := s.e.produceIDs("old", 20)
	rec, watch := &recorder{}, &pauseWatch{}
	r := s.member(rec, watch)
	s.e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
	require.False(t, s.storedTopicIDNull(), "the first start stored the topic id")

	ctx := context.Background()
	s.pause(watch, "replay the last messages")
	positions, err := offsets.NewStore(s.e.db.Schema)
	require.NoError(t, err)
	// An operator replays the last ten messages while the partition is
	// paused (the claims skip them: nothing is applied twice).
	require.NoError(t, positions.Reset(ctx, s.e.db.Pool, s.e.name, s.e.topic, 0, 10))
	s.resume()
	mid := s.e.produceIDs("mid", 5)
	waitFor(t, 30*time.Second, "the position past the new messages", func() bool { return s.e.storedPositions()[0] == 25 })
	require.False(t, s.storedTopicIDNull(), "the replay kept the topic id")

	s.e.recreateTopic()
	s.e.produceIDs("new", 40)
	waitFor(t, 60*time.Second, "the running member stopped the partition as re-created", func() bool { return rec.stoppedWith(consumer.ErrTopicRecreated) })
	r.stop()

	// A restart (a deploy, a crash): the partition must stop again.
	again := &recorder{}
	r = s.member(again)
	s.stopsOrApplies(again, "new", 40)
	r.stop()
	require.True(t, again.stoppedWith(consumer.ErrTopicRecreated), "the restarted member stops the partition as re-created")
	require.Equal(t, make([]bool, 40), s.e.appliedOf("new", 40), "none of the new topic's messages applied")
	s.e.requireExactlyOnce(append(old, mid...))
}

// A position moved with no member running (a replay, a skip) keeps its
// topic id: a topic re-created before the consumer starts again stops the
// partition, and none of the new topic's messages is applied from the
// old position.
func TestAResetBeforeARecreationStillStops(t *testing.T) {
	t.Parallel()
	s := setupRecreated(t, consumer.StartEarliest)
	s.e.produceIDs("old", 20)
	r := s.member()
	s.e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
	r.stop()

	positions, err := offsets.NewStore(s.e.db.Schema)
	require.NoError(t, err)
	require.NoError(t, positions.Reset(context.Background(), s.e.db.Pool, s.e.name, s.e.topic, 0, 15))

	s.e.recreateTopic()
	s.e.produceIDs("new", 40)
	rec := &recorder{}
	r = s.member(rec)
	s.stopsOrApplies(rec, "new", 40)
	r.stop()
	require.True(t, rec.stoppedWith(consumer.ErrTopicRecreated), "the partition stops as re-created")
	require.Equal(t, make([]bool, 40), s.e.appliedOf("new", 40), "none of the new topic's messages applied")
}

// The recovery from a re-creation while a partition is paused: the topic
// is re-created, the operator acknowledges it (TopicRecreated clears the
// stored id and sets the position to 0), then resumes the partition. The
// resumed worker decides as at an assignment: the position has no id, it
// takes the new topic's, and the new topic is processed from 0.
func TestARecreationAcknowledgedWhilePausedIsProcessed(t *testing.T) {
	t.Parallel()
	s := setupRecreated(t, consumer.StartEarliest)
	old := s.e.produceIDs("old", 20)
	rec, watch := &recorder{}, &pauseWatch{}
	r := s.member(rec, watch)
	s.e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
	ctx := context.Background()
	s.pause(watch, "topic maintenance")

	s.e.recreateTopic()
	fresh := s.e.produceIDs("new", 40)
	positions, err := offsets.NewStore(s.e.db.Schema)
	require.NoError(t, err)
	_, err = positions.TopicRecreated(ctx, s.e.db.Pool, s.e.name, s.e.topic, 1)
	require.NoError(t, err)
	s.resume()
	waitFor(t, 60*time.Second, "the new topic processed, or the partition stopped", func() bool {
		return rec.stoppedWith(consumer.ErrTopicRecreated) || s.e.storedPositions()[0] == 40
	})
	r.stop()
	require.False(t, rec.stoppedWith(consumer.ErrTopicRecreated), "a partition whose position the operator moved after the re-creation is not stopped as re-created")
	s.e.requireExactlyOnce(append(old, fresh...))
}

// A topic re-created with more partitions under a running member:
// partition 0 (a position of the old topic) stops with ErrTopicRecreated,
// partition 1 (no stored position, nothing to pass over) is processed at
// once and stores the new topic's id. topic-recreated, given the new
// topic's id (the CLI reads it), leaves partition 1 as it is: each message
// of either topic is applied once.
func TestTopicRecreatedLeavesPartitionsProcessedInTheNewTopic(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		start consumer.StartOffset
	}{{"earliest", consumer.StartEarliest}, {"latest", consumer.StartLatest}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			cfg := func(hooks ...consumer.Hook) *consumer.Config {
				cfg := e.config(e.applyHandler())
				cfg.MessageID = consumer.IDFromPosition()
				cfg.StartOffset = c.start
				cfg.MetadataMaxAge = time.Second
				cfg.Hooks = append(cfg.Hooks, hooks...)
				return cfg
			}
			rec := &recorder{}
			r := e.start(cfg(rec))
			waitFor(t, 30*time.Second, "the partition assigned", func() bool { _, holding := rec.assignments(); return holding == 1 })
			e.kafka.Produce(t, e.topic, msg(0, "old-0", "old-a"), msg(0, "old-1", "old-b"))
			e.waitCommitted(map[int]int64{0: 2}, 30*time.Second)

			ctx := context.Background()
			require.NoError(t, devenv.DeleteTopic(ctx, e.kafka.Brokers, e.topic))
			waitFor(t, 30*time.Second, "the topic re-created with 2 partitions", func() bool {
				return devenv.CreateTopic(ctx, e.kafka.Brokers, e.topic, 2) == nil
			})
			e.kafka.Produce(t, e.topic, msg(0, "new-0", "new-p0-a"), msg(0, "new-1", "new-p0-b"), msg(0, "new-2", "new-p0-c"),
				msg(1, "new-3", "new-p1-a"), msg(1, "new-4", "new-p1-b"))
			waitFor(t, 60*time.Second, "partition 0 stopped as re-created", func() bool { return rec.stoppedWith(consumer.ErrTopicRecreated) })
			// A restart: partition 1 is processed, partition 0 stops
			// again.
			r.stop()
			r = e.start(cfg())
			waitFor(t, 60*time.Second, "partition 1 processed", func() bool { return e.storedPositions()[1] == 2 })
			r.stop()

			positions, err := offsets.NewStore(e.db.Schema)
			require.NoError(t, err)
			res, err := positions.TopicRecreatedAs(ctx, e.db.Pool, e.name, e.topic, 2, e.topicID())
			require.NoError(t, err)
			require.EqualValues(t, 1, res.Kept, "partition 1 counts in the new topic already")

			r = e.start(cfg())
			waitFor(t, 60*time.Second, "both partitions processed", func() bool {
				p := e.storedPositions()
				return p[0] == 3 && p[1] == 2
			})
			r.stop()
			values := map[string]int{}
			rows, err := e.db.Pool.Query(ctx, `SELECT value FROM `+e.db.Table("effects"))
			require.NoError(t, err)
			for rows.Next() {
				var v string
				require.NoError(t, rows.Scan(&v))
				values["v-"+v]++
			}
			require.NoError(t, rows.Err())
			require.Equal(t, map[string]int{"v-old-a": 1, "v-old-b": 1, "v-new-p0-a": 1, "v-new-p0-b": 1, "v-new-p0-c": 1, "v-new-p1-a": 1, "v-new-p1-b": 1},
				values, "each message of either topic applied once")
		})
	}
}

// kafka-go: a topic deleted and re-created within the grace, again and
// again, never ends Run: each absence is measured from its own start.
func TestQuickRecreationsDoNotEndRun(t *testing.T) {
	t.Parallel()
	if kafkaClient() != consumer.KafkaGo {
		t.Skip("kafka-go only")
	}
	e := setup(t, 1)
	cfg := e.config(e.applyHandler())
	cfg.MetadataMaxAge = time.Second
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.produceIDs("a", 5)
	e.waitEffects(5, 30*time.Second)
	for i := range 2 {
		began := time.Now()
		dctx := context.Background()
		require.NoError(t, devenv.DeleteTopic(dctx, e.kafka.Brokers, e.topic))
		time.Sleep(2 * time.Second) // long enough for kafka-go to complain, far below 5 s
		waitFor(t, 30*time.Second, "the topic re-created", func() bool { return devenv.CreateTopic(dctx, e.kafka.Brokers, e.topic, 1) == nil })
		t.Logf("re-creation %d: the topic was missing for at most %v", i, time.Since(began))
		select {
		case err := <-done:
			t.Fatalf("Run returned %v %v after re-creation %d, which left the topic missing for at most %v", err, time.Since(began), i, time.Since(began))
		case <-time.After(10 * time.Second):
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			require.NoError(t, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of cancel")
	}
}

// A position that goes missing while a member runs (the database lost its
// row) is stored again by the next batch, and with it the topic's id: a
// later re-creation is still recognised.
func TestAPositionStoredAgainKeepsTheTopicID(t *testing.T) {
	t.Parallel()
	s := setupRecreated(t, consumer.StartEarliest)
	s.e.produceIDs("a", 10)
	r := s.member()
	s.e.waitCommitted(map[int]int64{0: 10}, 30*time.Second)
	s.e.db.Exec(t, `DELETE FROM `+s.e.db.Table("consumer_offsets")+` WHERE consumer = $1`, s.e.name)
	s.e.produceIDs("b", 5)
	waitFor(t, 60*time.Second, "the position stored again past the new messages", func() bool { return s.e.storedPositions()[0] == 15 })
	waitFor(t, 10*time.Second, "the topic id stored with it", func() bool { return !s.storedTopicIDNull() })
	r.stop()
}
