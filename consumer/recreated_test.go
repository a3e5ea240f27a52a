package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/offsets"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// A topic deleted and created again under the same name starts its offsets
// over, with other messages. The stored position keeps the id of the topic
// it counts in, so a member compares it with the topic it is assigned
// before it reads: whoever takes the partition, in whichever process,
// after however many restarts, stops it with ErrTopicRecreated, and none of
// the new topic's messages is applied or passed over until an operator
// moves the position.
func TestARecreatedTopicIsNeverPassedOver(t *testing.T) {
	t.Parallel()
	starts := map[string]consumer.StartOffset{"earliest": consumer.StartEarliest, "latest": consumer.StartLatest}
	for name, start := range starts {
		t.Run("a member that never saw the old topic, every restart and a Reset stop; topic-recreated resumes/"+name, func(t *testing.T) {
			t.Parallel()
			s := setupRecreated(t, start)
			first := &recorder{}
			r := s.member(first)
			// Produced once the partition has started: under StartLatest
			// too, the old topic's messages are processed.
			waitFor(t, 30*time.Second, "the partition assigned", func() bool { _, holding := first.assignments(); return holding == 1 })
			old := s.e.produceIDs("old", 20)
			s.e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
			r.stop()

			s.e.recreateTopic()
			fresh := s.e.produceIDs("new", 40)
			for restart := range 2 {
				rec := &recorder{}
				c := s.consumer(rec)
				r := s.e.run(c)
				waitFor(t, 60*time.Second, "the partition stopped as re-created", func() bool { return rec.stoppedWith(consumer.ErrTopicRecreated) })
				// The health report and the partition's run record (which
				// kafkaonce status and serve read) show the stop.
				h := c.Health(context.Background())
				require.Lenf(t, h.Stopped, 1, "restart %d: the health report lists the stopped partition", restart)
				require.Contains(t, h.Stopped[0], s.e.topic+"/0: ")
				require.Contains(t, h.Stopped[0], "created again")
				require.True(t, h.Live, "a stop waits for an operator: a restart would not help")
				require.EqualValues(t, 1, s.e.db.Int(t, `SELECT count(*) FROM `+s.e.db.Table("partition_runs")+`
WHERE consumer = $1 AND topic = $2 AND partition = 0 AND stopped_at IS NOT NULL AND stop_reason LIKE '%created again%'`, s.e.name, s.e.topic), "the run record shows the stop")
				r.stop()
				require.Equalf(t, map[int]int64{0: 20}, s.e.storedPositions(), "restart %d: the stored position stays", restart)
				require.Equalf(t, make([]bool, 40), s.e.appliedOf("new", 40), "restart %d: none of the new topic's messages applied", restart)
			}

			positions, err := offsets.NewStore(s.e.db.Schema)
			require.NoError(t, err)
			// A Reset moves the position within its topic: the partition
			// stays stopped. Acknowledging the re-creation starts it
			// afresh.
			require.NoError(t, positions.Reset(context.Background(), s.e.db.Pool, s.e.name, s.e.topic, 0, 0))
			rec := &recorder{}
			r = s.member(rec)
			waitFor(t, 60*time.Second, "the partition stopped again after a Reset", func() bool { return rec.stoppedWith(consumer.ErrTopicRecreated) })
			r.stop()
			_, err = positions.TopicRecreated(context.Background(), s.e.db.Pool, s.e.name, s.e.topic, 1)
			require.NoError(t, err)
			r = s.member()
			s.e.waitCommitted(map[int]int64{0: 40}, 60*time.Second)
			r.stop()
			s.e.requireExactlyOnce(append(old, fresh...))
		})
	}

	t.Run("a second member takes over from the one that stopped", func(t *testing.T) {
		t.Parallel()
		s := setupRecreated(t, consumer.StartEarliest)
		old := s.e.produceIDs("old", 20)
		first := &recorder{}
		a := s.member(first)
		s.e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
		// A member with nothing to do: the topic has one partition.
		second := &recorder{}
		b := s.member(second)

		s.e.recreateTopic()
		s.e.produceIDs("new", 40)
		waitFor(t, 60*time.Second, "a member stopped the partition as re-created", func() bool {
			return first.stoppedWith(consumer.ErrTopicRecreated) || second.stoppedWith(consumer.ErrTopicRecreated)
		})
		// A rolling deploy: the member that stopped it goes, the other
		// takes the partition and must stop it too.
		took := second
		if second.stoppedWith(consumer.ErrTopicRecreated) {
			b.stop()
			took = first
		} else {
			a.stop()
		}
		waitFor(t, 60*time.Second, "the other member stopped it too", func() bool { return took.stoppedWith(consumer.ErrTopicRecreated) })
		require.Equal(t, map[int]int64{0: 20}, s.e.storedPositions())
		require.Equal(t, make([]bool, 40), s.e.appliedOf("new", 40), "none of the new topic's messages applied")
		s.e.requireExactlyOnce(old)
	})

	t.Run("a partition paused through the re-creation stops when it resumes", func(t *testing.T) {
		t.Parallel()
		s := setupRecreated(t, consumer.StartEarliest)
		old := s.e.produceIDs("old", 20)
		rec, watch := &recorder{}, &pauseWatch{}
		r := s.member(rec, watch)
		s.e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
		s.pause(watch, "topic maintenance")

		s.e.recreateTopic()
		s.e.produceIDs("new", 40)
		s.resume()
		waitFor(t, 60*time.Second, "the partition stopped as re-created", func() bool { return rec.stoppedWith(consumer.ErrTopicRecreated) })
		r.stop()
		require.Equal(t, map[int]int64{0: 20}, s.e.storedPositions())
		require.Equal(t, make([]bool, 40), s.e.appliedOf("new", 40), "none of the new topic's messages applied")
		s.e.requireExactlyOnce(old)
	})

	t.Run("commits refused for an unknown topic are not retried", func(t *testing.T) {
		t.Parallel()
		s := setupRecreated(t, consumer.StartEarliest)
		if s.e.kafka.Fake == nil {
			t.Skip("the in-process broker answers the commits")
		}
		s.e.produceIDs("a", 5)
		r := s.member()
		s.e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
		// From now on the broker refuses the group's commits as it does
		// for a topic deleted (or re-created) under it: UNKNOWN_TOPIC_ID.
		refused := s.e.refuseCommits(errUnknownTopicID)
		s.e.produceIDs("b", 5)
		waitFor(t, 30*time.Second, "a commit refused", func() bool { return refused.Load() > 0 })
		// The committer retries a failed commit every second: three
		// seconds would show more.
		stillFor(t, 3*time.Second, "no refused commit sent again", func() bool { return refused.Load() == 1 })
		r.stop()
	})
}

// errUnknownTopicID is Kafka's UNKNOWN_TOPIC_ID.
const errUnknownTopicID = 100

// refuseCommits makes the in-process broker answer every offset commit of
// the test's group with code for each of its partitions, and returns how
// many it answered so.
func (e *env) refuseCommits(code int16) *atomic.Int64 {
	var n atomic.Int64
	e.kafka.Fake.ControlKey(kmsg.OffsetCommit.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		e.kafka.Fake.KeepControl()
		req := kreq.(*kmsg.OffsetCommitRequest)
		if req.Group != e.group {
			return nil, nil, false
		}
		n.Add(1)
		resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, t := range req.Topics {
			rt := kmsg.NewOffsetCommitResponseTopic()
			rt.Topic, rt.TopicID = t.Topic, t.TopicID
			for _, p := range t.Partitions {
				rp := kmsg.NewOffsetCommitResponseTopicPartition()
				rp.Partition, rp.ErrorCode = p.Partition, code
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		return resp, nil, true
	})
	return &n
}

// recreatedSetup runs members of one consumer on a one-partition topic.
type recreatedSetup struct {
	t     *testing.T
	e     *env
	start consumer.StartOffset
}

func setupRecreated(t *testing.T, start consumer.StartOffset) *recreatedSetup {
	return &recreatedSetup{t: t, e: setup(t, 1), start: start}
}

// member starts a member that reports to the test's recorder and to
// hooks.
func (s *recreatedSetup) member(hooks ...consumer.Hook) *running {
	return s.e.run(s.consumer(hooks...))
}

// pause pauses partition 0, as an operator does from another process, and
// waits until the member watch hears of it.
func (s *recreatedSetup) pause(watch *pauseWatch, reason string) {
	s.t.Helper()
	_, err := s.pauses().Pause(context.Background(), s.e.db.Pool, s.e.name, pauses.Partition(s.e.topic, 0), "test", reason)
	require.NoError(s.t, err)
	waitFor(s.t, 10*time.Second, "the member to see the pause", func() bool { return watch.paused(0) })
}

// resume lifts the pause of partition 0.
func (s *recreatedSetup) resume() {
	s.t.Helper()
	_, err := s.pauses().Resume(context.Background(), s.e.db.Pool, s.e.name, pauses.Partition(s.e.topic, 0))
	require.NoError(s.t, err)
}

func (s *recreatedSetup) pauses() *pauses.Store {
	store, err := pauses.NewStore(s.e.db.Schema)
	require.NoError(s.t, err)
	return store
}

// consumer is a member, not started.
func (s *recreatedSetup) consumer(hooks ...consumer.Hook) *consumer.Consumer {
	cfg := s.e.config(s.e.applyHandler())
	cfg.StartOffset = s.start
	cfg.MetadataMaxAge = time.Second
	cfg.Hooks = append(cfg.Hooks, hooks...)
	c, err := consumer.New(s.e.db.Pool, cfg)
	require.NoError(s.t, err)
	return c
}

// A topic of the group deleted while members run: with franz-go the other
// topics go on; kafka-go's group cannot run a generation without it, so
// Run returns an error that names the topic and the franz-go client,
// instead of rejoining for ever.
func TestADeletedTopicOfTheGroup(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	other := e.kafka.Topic(t, 1)
	cfg := e.config(e.applyHandler())
	cfg.Topics = []string{e.topic, other}
	cfg.MetadataMaxAge = time.Second
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.produceIDs("before", 5)
	e.waitEffects(5, 30*time.Second)

	delCtx, delCancel := context.WithTimeout(context.Background(), time.Minute)
	defer delCancel()
	require.NoError(t, devenv.DeleteTopic(delCtx, e.kafka.Brokers, e.topic))

	if kafkaClient() == consumer.KafkaGo {
		select {
		case err := <-done:
			require.Error(t, err)
			require.Contains(t, err.Error(), e.topic)
			require.Contains(t, err.Error(), "franz-go")
		case <-time.After(60 * time.Second):
			t.Fatal("Run did not return within 60s of the topic's deletion")
		}
		return
	}
	e.kafka.Produce(t, other, msg(0, "other-0", "v"), msg(0, "other-1", "v"))
	e.waitEffects(7, 60*time.Second)
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
