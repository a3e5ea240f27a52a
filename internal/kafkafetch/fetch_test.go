package kafkafetch_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/kafkafetch"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// open starts a fetcher of partition 0 of a new topic holding n messages.
func open(t *testing.T, n, maxBatch int, linger, quiet time.Duration) *kafkafetch.Fetcher {
	t.Helper()
	k := testenv.NewKafka(t)
	topic := k.Topic(t, 1)
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Value: []byte(strconv.Itoa(i))}
	}
	k.Produce(t, topic, msgs...)
	f, err := kafkafetch.Open(kafkafetch.Config{Brokers: k.Brokers, Topic: topic, Start: kafka.FirstOffset,
		MaxBatch: maxBatch, Linger: linger, Quiet: quiet, MaxBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// A batch goes as soon as the partition has nothing more to give, not
// after the whole linger time. Without the quiet time this Next would wait
// out the context (the linger is longer still) and take 20 seconds.
func TestNextEndsWhenThePartitionGoesQuiet(t *testing.T) {
	f := open(t, 5, 100, time.Minute, 100*time.Millisecond)
	ctx := testenv.Context(t, 20*time.Second)
	began := time.Now()
	batch, err := f.Next(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	if len(batch) != 5 {
		t.Fatalf("batch of %d messages, want all 5", len(batch))
	}
	if took > 10*time.Second {
		t.Fatalf("Next took %v: it waited for the linger (or the context) instead of ending when no message came for 100ms", took)
	}
}

// Messages that are ready fill batches to MaxBatch: the quiet time only
// ends a batch when the queue has run dry, and never loses a message.
func TestNextFillsBatchesFromReadyMessages(t *testing.T) {
	f := open(t, 500, 200, 2*time.Second, 200*time.Millisecond)
	ctx := testenv.Context(t, time.Minute)
	var sizes []int
	next := int64(0)
	for next < 500 {
		batch, err := f.Next(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range batch {
			if m.Offset != next {
				t.Fatalf("offset %d after %d: a message was skipped or repeated", m.Offset, next-1)
			}
			next++
		}
		sizes = append(sizes, len(batch))
	}
	if len(sizes) != 3 || sizes[0] != 200 || sizes[1] != 200 {
		t.Fatalf("batch sizes %v, want [200 200 100]: ready messages did not fill the batches", sizes)
	}
}
