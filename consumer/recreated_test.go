package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
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
		t.Run("a member that never saw the old topic, and every restart, stop; a reset resumes/"+name, func(t *testing.T) {
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
				r := s.member(rec)
				waitFor(t, 60*time.Second, "the partition stopped as re-created", func() bool { return rec.stoppedWith(consumer.ErrTopicRecreated) })
				r.stop()
				require.Equalf(t, map[int]int64{0: 20}, s.e.storedPositions(), "restart %d: the stored position stays", restart)
				require.Equalf(t, make([]bool, 40), s.e.appliedOf("new", 40), "restart %d: none of the new topic's messages applied", restart)
			}

			positions, err := offsets.NewStore(s.e.db.Schema)
			require.NoError(t, err)
			require.NoError(t, positions.Reset(context.Background(), s.e.db.Pool, s.e.name, s.e.topic, 0, 0))
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
		ctx := context.Background()
		store, err := pauses.NewStore(s.e.db.Schema)
		require.NoError(t, err)
		_, err = store.Pause(ctx, s.e.db.Pool, s.e.name, pauses.Partition(s.e.topic, 0), "test", "topic maintenance")
		require.NoError(t, err)
		waitFor(t, 10*time.Second, "the member to see the pause", func() bool { return watch.paused(0) })

		s.e.recreateTopic()
		s.e.produceIDs("new", 40)
		_, err = store.Resume(ctx, s.e.db.Pool, s.e.name, pauses.Partition(s.e.topic, 0))
		require.NoError(t, err)
		waitFor(t, 60*time.Second, "the partition stopped as re-created", func() bool { return rec.stoppedWith(consumer.ErrTopicRecreated) })
		r.stop()
		require.Equal(t, map[int]int64{0: 20}, s.e.storedPositions())
		require.Equal(t, make([]bool, 40), s.e.appliedOf("new", 40), "none of the new topic's messages applied")
		s.e.requireExactlyOnce(old)
	})
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
	cfg := s.e.config(s.e.applyHandler())
	cfg.StartOffset = s.start
	cfg.MetadataMaxAge = time.Second
	cfg.Hooks = append(cfg.Hooks, hooks...)
	return s.e.start(cfg)
}
