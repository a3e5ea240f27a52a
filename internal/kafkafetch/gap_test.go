package kafkafetch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestGap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name                          string
		expected, processed, logStart int64
		lost                          bool
		from                          int64
	}{
		{"compaction: the log still starts before the gap", 20, 20, 0, false, 0},
		{"compaction: the log starts at the gap", 20, 20, 20, false, 0},
		{"deleted before they were fetched", 20, 20, 50, true, 20},
		{"deleted, nothing stored", 20, -1, 50, true, 20},
		{"deleted, and the stored position lost transactions", 20, 10, 50, true, 20},
		{"deleted after another reader processed part of them", 20, 30, 50, true, 30},
		{"deleted after another reader processed them all", 20, 50, 50, false, 0},
		{"deleted after another reader went further", 20, 60, 50, false, 0},
		// The ambiguous case: a compaction gap that retention passed
		// before the lookup is reported.
		{"compacted, then passed by retention", 20, 20, 21, true, 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			lost, from := Gap(c.expected, c.processed, c.logStart)
			require.Equal(t, c.lost, lost)
			require.Equal(t, c.from, from)
		})
	}
}

// partitionOf produces n messages with values "0".."n-1" to partition 0 of
// a new topic.
func partitionOf(t *testing.T, k *testenv.Kafka, n int) string {
	t.Helper()
	topic := k.Topic(t, 1)
	produce(t, k, topic, 0, n)
	return topic
}

func produce(t *testing.T, k *testenv.Kafka, topic string, from, to int) {
	t.Helper()
	var msgs []kafka.Message
	for i := from; i < to; i++ {
		msgs = append(msgs, kafka.Message{Value: []byte(strconv.Itoa(i))})
	}
	k.Produce(t, topic, msgs...)
}

func openAt(t *testing.T, k *testenv.Kafka, topic string, start int64, maxBatch int, processed func(context.Context) (int64, error)) *Fetcher {
	t.Helper()
	f, err := Open(Config{Brokers: k.Brokers, Topic: topic, Start: start, MaxBatch: maxBatch,
		Linger: time.Second, Quiet: 100 * time.Millisecond, MaxBytes: 1 << 20, Processed: processed})
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// readUntilError reads batches until Next fails, requiring consecutive
// offsets from start, and returns the offset expected next and the error.
func readUntilError(t *testing.T, f *Fetcher, start int64) (int64, error) {
	t.Helper()
	ctx := testenv.Context(t, 30*time.Second)
	next := start
	for {
		batch, err := f.Next(ctx, nil)
		for _, m := range batch {
			require.Equal(t, next, m.Offset, "offsets handed out in order, none skipped")
			next++
		}
		if err != nil {
			return next, err
		}
	}
}

// kafka-go skips from offset 20 to the log start, 50, in its read loop:
// the messages it had fetched before the deletion go out, then the fetcher
// stops at the gap.
func TestNextStopsAtMessagesDeletedWhileReading(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	topic := partitionOf(t, k, 20)
	f := openAt(t, k, topic, 0, 5, nil)
	// The first batch is taken; kafka-go holds the rest of its first
	// fetch (offsets 5 to 19), waiting for room in its queue.
	batch, err := f.Next(testenv.Context(t, 30*time.Second), nil)
	require.NoError(t, err)
	require.Len(t, batch, 5)
	produce(t, k, topic, 20, 60)
	k.DeleteRecordsBefore(t, topic, 0, 50)

	next, err := readUntilError(t, f, 5)
	var d *DeletedError
	require.ErrorAs(t, err, &d)
	require.Equal(t, int64(20), next, "every message fetched before the deletion went out")
	require.Equal(t, DeletedError{Topic: topic, Partition: 0, From: 20, LogStart: 50}, *d)
	_, again := f.Next(context.Background(), nil)
	require.Equal(t, err, again, "the fetcher stays at the gap")
}

// A fetcher opened below the log start: kafka-go seeks to the log start.
func TestNextStopsAtMessagesDeletedBeforeItOpened(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	topic := partitionOf(t, k, 60)
	k.DeleteRecordsBefore(t, topic, 0, 50)
	f := openAt(t, k, topic, 20, 100, nil)
	next, err := readUntilError(t, f, 20)
	var d *DeletedError
	require.ErrorAs(t, err, &d)
	require.Equal(t, int64(20), next, "nothing handed out")
	require.Equal(t, int64(20), d.From)
	require.Equal(t, int64(50), d.LogStart)
}

// A reader that was paused while another processed the partition past the
// deletion (the stored position says so) has lost nothing: it goes on.
func TestNextGoesOnWhenTheDeletedMessagesWereProcessed(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	topic := partitionOf(t, k, 60)
	k.DeleteRecordsBefore(t, topic, 0, 50)
	for _, c := range []struct {
		processed int64
		wantErr   bool
	}{{50, false}, {60, false}, {49, true}} {
		t.Run(fmt.Sprint("processed=", c.processed), func(t *testing.T) {
			f := openAt(t, k, topic, 20, 100, func(context.Context) (int64, error) { return c.processed, nil })
			batch, err := f.Next(testenv.Context(t, 30*time.Second), nil)
			if c.wantErr {
				var d *DeletedError
				require.ErrorAs(t, err, &d)
				require.Equal(t, int64(49), d.From, "the loss starts at the processed position")
				return
			}
			require.NoError(t, err)
			require.Len(t, batch, 10)
			require.Equal(t, int64(50), batch[0].Offset)
		})
	}
}

// compactedTopic makes a compacted partition whose offsets 1 to 6 hold no
// record any more while the log still starts at 0: offsets 0, 7, 8, ... 13
// remain.
func compactedTopic(t *testing.T) (*testenv.Kafka, string) {
	t.Helper()
	dk, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { _ = dk.Close() })
	k := &testenv.Kafka{Kafka: dk}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.DefaultProduceTopic("compacted"))
	require.NoError(t, err)
	defer cl.Close()
	ctx := testenv.Context(t, 30*time.Second)
	policy := "compact"
	_, err = kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"cleanup.policy": &policy}, "compacted")
	require.NoError(t, err)
	// Four produce calls, four record batches: u0 k0 k1 k2 | k0 k1 k2 |
	// u2 k0 k1 k2 | k0 k1 k2. Compaction drops the superseded keys of the
	// first two batches and leaves the last ones.
	for b := range 4 {
		var rs []*kgo.Record
		if b%2 == 0 {
			rs = append(rs, &kgo.Record{Key: fmt.Appendf(nil, "u%d", b), Value: []byte("unique")})
		}
		for j := range 3 {
			rs = append(rs, &kgo.Record{Key: fmt.Appendf(nil, "k%d", j), Value: fmt.Appendf(nil, "%d/%d", b, j)})
		}
		require.NoError(t, cl.ProduceSync(ctx, rs...).FirstErr())
	}
	k.Fake.Compact()
	return k, "compacted"
}

// Offsets without a record (compaction) are no loss: the batch goes on
// across them.
func TestNextGoesOnAcrossACompactionGap(t *testing.T) {
	t.Parallel()
	k, topic := compactedTopic(t)
	var lookups int
	f := openAt(t, k, topic, 0, 100, func(context.Context) (int64, error) { lookups++; return 0, nil })
	batch, err := f.Next(testenv.Context(t, 30*time.Second), nil)
	require.NoError(t, err)
	var offsets []int64
	for _, m := range batch {
		offsets = append(offsets, m.Offset)
	}
	require.Equal(t, []int64{0, 7, 8, 9, 10, 11, 12, 13}, offsets)
	require.Equal(t, 1, lookups, "one lookup explained the batch's gap")
}

// When the gap cannot be looked into, the messages before it go out and
// the lookup's error comes next; nothing after the gap goes out.
func TestNextStopsAtAGapItCannotLookInto(t *testing.T) {
	t.Parallel()
	k, topic := compactedTopic(t)
	f := openAt(t, k, topic, 0, 100, nil)
	down := errors.New("broker unreachable")
	f.bounds = func(context.Context) (int64, int64, error) { return 0, 0, down }
	next, err := readUntilError(t, f, 0)
	require.ErrorIs(t, err, down)
	require.Equal(t, int64(1), next, "offset 0 went out, nothing after the gap")
}
