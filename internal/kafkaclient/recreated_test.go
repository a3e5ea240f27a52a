package kafkaclient_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A fetcher opened for a topic id hands out nothing of a topic deleted
// and created again under the same name, whose offsets start over with
// other records: neither while it waits at the old end, nor once the new
// log has grown past the offset it expects. (The consumer's
// TestARecreatedTopicIsNeverPassedOver covers kafka-go's reader going on
// at the old offset in the new topic, which each batch's check of the id
// stops.)
func TestAFetcherHandsOutNothingOfARecreatedTopic(t *testing.T) {
	for _, shape := range []struct {
		name string
		// grown: the new topic has records at and past the offset the
		// fetcher expects before it looks again.
		grown bool
	}{{"idle at the old end", false}, {"the new log grown past the offset expected", true}} {
		t.Run(shape.name, func(t *testing.T) {
			eachClient(t, func(t *testing.T, client string) {
				s := newSetup(t, client, testenv.NewKafka(t))
				topic := s.partitionOf(20)
				ctx := testenv.Context(t, time.Minute)
				b, err := s.client.Bounds(ctx, topic, 0)
				require.NoError(t, err)
				require.False(t, b.TopicID.IsZero(), "the broker gives topic ids")
				f, err := s.client.Open(kafkaclient.FetchConfig{Topic: topic, Start: 0, TopicID: b.TopicID, MaxBatch: 10,
					Linger: 10 * time.Millisecond, IdleCheck: 200 * time.Millisecond})
				require.NoError(t, err)
				t.Cleanup(f.Close)
				// The old topic's records, read: the client's fetching is
				// under way at offset 20 when the topic goes.
				for next := int64(0); next < 20; {
					batch, err := f.Next(ctx, nil)
					require.NoError(t, err)
					next += int64(len(batch))
				}

				require.NoError(t, devenv.DeleteTopic(ctx, s.k.Brokers, topic))
				waitUntil(t, "the topic re-created", func() bool { return devenv.CreateTopic(ctx, s.k.Brokers, topic, 1) == nil })
				if shape.grown {
					s.produce(topic, 0, 40)
				}
				nb, err := s.client.Bounds(ctx, topic, 0)
				require.NoError(t, err)
				require.True(t, b.TopicID.Differs(nb.TopicID), "the new topic has another id")

				_, err = readUntilError(t, f, 20)
				var recreated *kafkaclient.RecreatedError
				require.Truef(t, errors.As(err, &recreated), "Next ends with a *RecreatedError, got %v", err)
				require.Equal(t, b.TopicID, recreated.Expected)
			})
		})
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
