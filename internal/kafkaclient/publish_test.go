package kafkaclient_test

import (
	"context"
	"crypto/rand"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Both clients answer a call with records too large among others the same
// way: each too large one fails alone, wrapping ErrTooLarge, and the
// others are written. Too large means over MaxRecordBytes (refused by the
// client) or over the topic's max.message.bytes (refused by the broker).
func TestPublishFailsOnlyTheRecordsTooLarge(t *testing.T) {
	eachClient(t, func(t *testing.T, name string) {
		k := testenv.NewKafka(t)
		c := newClient(t, name, k.Brokers)
		const topicLimit = 64 << 10
		topic := testenv.Name(t, "topic")
		limit := strconv.Itoa(topicLimit)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := kadm.NewClient(k.Client(t)).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &limit}, topic)
		require.NoError(t, err)

		big := make([]byte, kafkaclient.MaxRecordBytes)
		_, err = rand.Read(big) // a compressing client cannot shrink it
		require.NoError(t, err)
		overLimit := kafkaclient.Record{Key: []byte("a"), Value: big}
		require.Greater(t, kafkaclient.RecordBytes(&overLimit), kafkaclient.MaxRecordBytes)
		// One over MaxRecordBytes: the client refuses it, and writes the
		// others.
		err = c.Publish(ctx, topic, []kafkaclient.Record{{Key: []byte("a"), Value: []byte("first")}, overLimit, {Key: []byte("c"), Value: []byte("second")}})
		var each kafkaclient.PublishErrors
		require.ErrorAs(t, err, &each)
		require.Len(t, each, 3)
		require.NoError(t, each[0])
		require.ErrorIs(t, each[1], kafkaclient.ErrTooLarge, "refused by the client")
		require.NoError(t, each[2])

		// One over the topic's limit, alone and with another: the broker
		// refuses it, and the batch it is in.
		overTopic := kafkaclient.Record{Key: []byte("b"), Value: big[:topicLimit]}
		err = c.Publish(ctx, topic, []kafkaclient.Record{overTopic})
		require.ErrorAs(t, err, &each)
		require.ErrorIs(t, each[0], kafkaclient.ErrTooLarge, "refused by the broker alone")
		err = c.Publish(ctx, topic, []kafkaclient.Record{{Key: []byte("a"), Value: []byte("beside")}, overTopic})
		require.ErrorAs(t, err, &each)
		require.Len(t, each, 2)
		require.ErrorIs(t, each[1], kafkaclient.ErrTooLarge, "refused by the broker")
		if each[0] != nil {
			require.ErrorIs(t, each[0], kafkaclient.ErrTooLarge, "refused with its batch")
		}
		require.NoError(t, c.Publish(ctx, topic, []kafkaclient.Record{{Key: []byte("c"), Value: []byte("last")}}), "the client goes on")

		rd := kafka.NewReader(kafka.ReaderConfig{Brokers: k.Brokers, Topic: topic, Partition: 0, MaxWait: 100 * time.Millisecond})
		defer rd.Close()
		var got []string
		for len(got) == 0 || got[len(got)-1] != "last" {
			m, err := rd.ReadMessage(ctx)
			require.NoError(t, err, "read so far: %v", got)
			got = append(got, string(m.Value))
		}
		want := []string{"first", "second", "last"}
		if each[0] == nil {
			want = []string{"first", "second", "beside", "last"}
		}
		require.Equal(t, want, got)
	})
}

// A record of exactly MaxRecordBytes, headers counted, is written to a
// topic at the broker's default limits; one byte more is refused by the
// client alone, and the record behind it of another key is written.
func TestPublishWritesARecordOfExactlyMaxRecordBytesWithHeaders(t *testing.T) {
	eachClient(t, func(t *testing.T, name string) {
		k := testenv.NewKafka(t)
		c := newClient(t, name, k.Brokers)
		topic := k.Topic(t, 1)
		ctx := testenv.Context(t, time.Minute)
		sized := func(key string, n int) kafkaclient.Record {
			r := kafkaclient.Record{Key: []byte(key), Headers: []kafkaoncetype.Header{
				{Key: "message-id", Value: []byte("0123456789abcdef0123456789abcdef")}, {Key: "h", Value: make([]byte, 300)}, {Key: "", Value: nil}}}
			r.Value = make([]byte, n-kafkaclient.RecordBytes(&r))
			_, _ = rand.Read(r.Value)
			copy(r.Value, key+":")
			require.Equal(t, n, kafkaclient.RecordBytes(&r))
			return r
		}
		require.NoError(t, c.Publish(ctx, topic, []kafkaclient.Record{sized("at", kafkaclient.MaxRecordBytes)}))
		err := c.Publish(ctx, topic, []kafkaclient.Record{sized("over", kafkaclient.MaxRecordBytes+1), rec("b", "last:")})
		var each kafkaclient.PublishErrors
		require.ErrorAs(t, err, &each)
		require.ErrorIs(t, each[0], kafkaclient.ErrTooLarge)
		require.NoError(t, each[1])
		require.Equal(t, []string{"at", "last"}, readUntilLast(t, k.Brokers, topic))
	})
}
