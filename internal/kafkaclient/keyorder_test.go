package kafkaclient_test

import (
	"crypto/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// Both clients keep a key's records in order: once one fails, none of the
// key's records after it in the call is written (each fails, wrapping the
// first one's error), so a caller that sends the failed ones again never
// puts one behind a later record of its key. The other keys' records are
// written, unless the broker refused them with the failed one.
func TestPublishKeepsEachKeysOrder(t *testing.T) {
	eachClient(t, func(t *testing.T, name string) {
		t.Run("RefusedByTheClient", func(t *testing.T) {
			t.Parallel()
			k := testenv.NewKafka(t)
			c := newClient(t, name, k.Brokers)
			topic := k.Topic(t, 1)
			ctx := testenv.Context(t, time.Minute)
			err := c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "a-0:"), rec("a", "a-1:", kafkaclient.MaxRecordBytes), rec("a", "a-2:"), rec("b", "b-0:")})
			var each kafkaclient.PublishErrors
			require.ErrorAs(t, err, &each)
			require.Len(t, each, 4)
			require.NoError(t, each[0])
			require.ErrorIs(t, each[1], kafkaclient.ErrTooLarge)
			require.ErrorIs(t, each[2], kafkaclient.ErrHeldBack, "behind a-1")
			require.ErrorIs(t, each[2], kafkaclient.ErrTooLarge, "with a-1's error")
			require.NoError(t, each[3])
			require.NoError(t, c.Publish(ctx, topic, []kafkaclient.Record{rec("c", "last:")}))
			require.Equal(t, []string{"a-0", "b-0", "last"}, readUntilLast(t, k.Brokers, topic))
		})
		t.Run("RefusedByTheBroker", func(t *testing.T) {
			t.Parallel()
			fk, err := devenv.StartFakeKafka()
			require.NoError(t, err)
			t.Cleanup(func() { _ = fk.Close() })
			k := &testenv.Kafka{Kafka: fk}
			c := newClient(t, name, k.Brokers)
			topic := k.Topic(t, 1)
			k.RefuseProduce("a-0:", kerr.MessageTooLarge.Code, true)
			ctx := testenv.Context(t, time.Minute)
			// Together larger than a batch: a-1 goes in a batch of its own,
			// which the broker would take.
			err = c.Publish(ctx, topic, []kafkaclient.Record{rec("a", "a-0:", 600<<10), rec("a", "a-1:", 600<<10), rec("b", "b-0:")})
			var each kafkaclient.PublishErrors
			require.ErrorAs(t, err, &each)
			require.Len(t, each, 3)
			require.ErrorIs(t, each[0], kafkaclient.ErrTooLarge)
			require.ErrorIs(t, each[1], kafkaclient.ErrTooLarge, "behind a-0, with its error")
			want := []string{"last"}
			if each[2] == nil { // kafka-go sent it in a batch after a-0's
				want = []string{"b-0", "last"}
			}
			require.NoError(t, c.Publish(ctx, topic, []kafkaclient.Record{rec("c", "last:")}))
			require.Equal(t, want, readUntilLast(t, k.Brokers, topic))
		})
	})
}

// Both clients put a key in the same partition: the one kafka-go's Hash
// balancer picks.
func TestPublishPartitionsByKeyAlike(t *testing.T) {
	eachClient(t, func(t *testing.T, name string) {
		k := testenv.NewKafka(t)
		c := newClient(t, name, k.Brokers)
		const partitions = 5
		topic := k.Topic(t, partitions)
		var recs []kafkaclient.Record
		want := map[string]int{}
		ps := []int{0, 1, 2, 3, 4}
		for i := range 20 {
			key := "key-" + strconv.Itoa(i)
			recs = append(recs, rec(key, key+":"))
			want[key] = (&kafka.Hash{}).Balance(kafka.Message{Key: []byte(key)}, ps...)
		}
		require.NoError(t, c.Publish(testenv.Context(t, time.Minute), topic, recs))
		got := map[string]int{}
		for p := range partitions {
			rd := kafka.NewReader(kafka.ReaderConfig{Brokers: k.Brokers, Topic: topic, Partition: p, MaxWait: 100 * time.Millisecond})
			ctx := testenv.Context(t, 30*time.Second)
			for {
				lag, err := rd.ReadLag(ctx)
				require.NoError(t, err)
				if lag == 0 {
					break
				}
				m, err := rd.ReadMessage(ctx)
				require.NoError(t, err)
				got[string(m.Key)] = p
			}
			require.NoError(t, rd.Close())
		}
		require.Equal(t, want, got)
	})
}

// rec is a record of key whose value starts with prefix, padded with
// random bytes (which no compression shrinks) to size.
func rec(key, prefix string, size ...int) kafkaclient.Record {
	v := []byte(prefix)
	if len(size) > 0 {
		pad := make([]byte, size[0]-len(v))
		_, _ = rand.Read(pad)
		v = append(v, pad...)
	}
	return kafkaclient.Record{Key: []byte(key), Value: v}
}

// readUntilLast reads partition 0 of topic up to the record "last:", and
// returns the records' prefixes.
func readUntilLast(t *testing.T, brokers []string, topic string) []string {
	t.Helper()
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond, MaxBytes: 4 << 20})
	defer rd.Close()
	ctx := testenv.Context(t, 30*time.Second)
	var got []string
	for len(got) == 0 || got[len(got)-1] != "last" {
		m, err := rd.ReadMessage(ctx)
		require.NoError(t, err, "read so far: %v", got)
		got = append(got, strings.SplitN(string(m.Value), ":", 2)[0])
	}
	return got
}
