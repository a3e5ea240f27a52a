package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

// A topic re-created with more partitions under a running member: the new
// partition 1 has nothing to pass over and is processed, although the
// member's franz-go client fetches it under the old topic id at first (kgo
// keeps a topic's first id until the topic is purged from the client): the
// broker's answer shows the client stale, and the hub purges the topic and
// fetches again under the new id.
func TestANewPartitionOfARecreatedTopicIsProcessed(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	cfg := e.config(e.applyHandler())
	cfg.MetadataMaxAge = time.Second
	rec := &recorder{}
	cfg.Hooks = append(cfg.Hooks, rec)
	r := e.start(cfg)
	e.kafka.Produce(t, e.topic, msg(0, "old-0", "old-a"), msg(0, "old-1", "old-b"))
	e.waitCommitted(map[int]int64{0: 2}, 30*time.Second)

	ctx := context.Background()
	require.NoError(t, devenv.DeleteTopic(ctx, e.kafka.Brokers, e.topic))
	waitFor(t, 30*time.Second, "the topic re-created with 2 partitions", func() bool {
		return devenv.CreateTopic(ctx, e.kafka.Brokers, e.topic, 2) == nil
	})
	e.kafka.Produce(t, e.topic, msg(0, "new-0", "new-p0-a"), msg(1, "new-1", "new-p1-a"), msg(1, "new-2", "new-p1-b"))
	waitFor(t, 90*time.Second, "partition 1 processed, or stopped", func() bool {
		return e.storedPositions()[1] == 2 || len(stoppedOf(rec, 1)) > 0
	})
	r.stop()
	require.Empty(t, stoppedOf(rec, 1), "partition 1 (no stored position, nothing to pass over) is not stopped")
	require.Equal(t, []bool{true, true}, e.appliedOf("new", 3)[1:], "partition 1's messages applied")
}

func stoppedOf(r *recorder, partition int) []string {
	var out []string
	for _, err := range r.snapshot().stopped {
		if err.Partition == partition {
			out = append(out, err.Error())
		}
	}
	return out
}
