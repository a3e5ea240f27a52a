package kafkaclient_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/internal/devenv"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/kafkago"
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

// A call as large as the relay's largest batch (10,000 records) is
// written whole after a call that gave up, to another topic, left its
// records behind: they take no room the next call needs.
func TestPublishOfTheLargestBatchAfterACallThatGaveUpOnAnotherTopic(t *testing.T) {
	eachClient(t, func(t *testing.T, name string) {
		fk, err := devenv.StartFakeKafka()
		require.NoError(t, err)
		t.Cleanup(func() { _ = fk.Close() })
		k := &testenv.Kafka{Kafka: fk}
		c := newClient(t, name, k.Brokers)
		stuck, topic := k.Topic(t, 1), k.Topic(t, 1)
		ctx := testenv.Context(t, time.Minute)
		require.NoError(t, c.Publish(ctx, stuck, []kafkaclient.Record{rec("s", "warm:")}))
		require.NoError(t, c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "warm:")}))
		var left []kafkaclient.Record
		for i := range 100 {
			left = append(left, rec("s"+strconv.Itoa(i), "s:"))
		}
		// The broker refuses them (retriably) until the call gives up.
		k.RefuseProduce("s:", kerr.NotEnoughReplicas.Code, true)
		short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		require.Error(t, c.Publish(short, stuck, left))
		var recs []kafkaclient.Record
		for i := range 10000 - 1 {
			recs = append(recs, rec("k"+strconv.Itoa(i%50), "r:"))
		}
		recs = append(recs, rec("a", "last:"))
		err = c.Publish(ctx, topic, recs)
		var each kafkaclient.PublishErrors
		if errors.As(err, &each) {
			n := 0
			for _, e := range each {
				if e != nil {
					n++
				}
			}
			require.NoError(t, err, "%d of %d records failed", n, len(recs))
		}
		require.NoError(t, err)
	})
}

// Close while a Publish waits for the broker ends the call, with an error,
// and leaves no producer goroutine; a Publish after Close fails and starts
// none.
func TestPublishEndsWhenTheClientCloses(t *testing.T) {
	eachClient(t, func(t *testing.T, name string) {
		fk, err := devenv.StartFakeKafka()
		require.NoError(t, err)
		t.Cleanup(func() { _ = fk.Close() })
		k := &testenv.Kafka{Kafka: fk}
		topic := k.Topic(t, 1)
		ctx := testenv.Context(t, time.Minute)
		var refused atomic.Int64
		k.Fake.ControlKey(kmsg.Produce.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
			k.Fake.KeepControl()
			refused.Add(1)
			return nil, nil, false
		})
		k.RefuseProduce("held:", kerr.NotEnoughReplicas.Code, true)

		cfg := kafkaclient.Config{Brokers: k.Brokers, MaxBatch: 100, FetchMaxBytes: 1 << 20}
		var c kafkaclient.Client
		if name == "kafka-go" {
			c, err = kafkago.New(cfg, nil)
		} else {
			c, err = franz.New(cfg)
		}
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "held:")}) }()
		waitUntil(t, "the broker to refuse the record once", func() bool { return refused.Load() > 1 })
		c.Close()
		select {
		case err := <-done:
			require.Error(t, err)
		case <-ctx.Done():
			t.Fatal("Publish did not return after Close")
		}
		require.Error(t, c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "after:")}))
	})
}

// A Publish racing the client's first Close either fails or is closed:
// no producer outlives Close.
func TestCloseRacingTheFirstPublish(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	ctx := testenv.Context(t, time.Minute)
	c, err := franz.New(kafkaclient.Config{Brokers: k.Brokers, MaxBatch: 100, FetchMaxBytes: 1 << 20})
	require.NoError(t, err)
	start := make(chan struct{})
	done := make(chan error, 1)
	go func() { <-start; done <- c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "a:")}) }()
	close(start)
	c.Close()
	<-done
	require.Error(t, c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "after:")}), "a Publish after Close")
}
