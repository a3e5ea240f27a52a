package kafkaclient_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A call whose context ended before its records were written leaves
// nothing behind that fails the next call: the next call's records, of the
// same key and partition, are written and reported written.
func TestPublishAfterACallThatGaveUpWritesTheNextCallsRecords(t *testing.T) {
	eachClient(t, func(t *testing.T, name string) {
		k := testenv.NewKafka(t)
		c := newClient(t, name, k.Brokers)
		topic := k.Topic(t, 1)
		ctx := testenv.Context(t, time.Minute)
		// Warm the client up: the topic's metadata is known.
		require.NoError(t, c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "warm:")}))
		gone, cancel := context.WithCancel(ctx)
		cancel()
		require.Error(t, c.Publish(gone, topic, []kafkaclient.Record{rec("a", "a-0:")}))
		require.NoError(t, c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "a-1:"), rec("a", "last:")}))
		got := readUntilLast(t, k.Brokers, topic)
		require.Equal(t, []string{"a-1", "last"}, trimStale(got, "warm", "a-0"))
	})
}

// trimStale drops from got the records named stale, which a call that
// gave up may or may not have written.
func trimStale(got []string, stale ...string) []string {
	var out []string
	for _, g := range got {
		keep := true
		for _, s := range stale {
			keep = keep && g != s
		}
		if keep {
			out = append(out, g)
		}
	}
	return out
}
