package consumer_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

// A letter larger than the dead-letter topic takes (a message the source
// topic accepted, whose letter's headers push it past the writer's limit,
// or past a dead-letter topic's smaller max.message.bytes) is published cut
// to fit, marked with what was cut, its original size and why, and holds
// back no other letter: the letters behind it reach the topic too. The
// whole letter stays in dead_letters.
func TestALetterTooLargeForTheDeadLetterTopicIsCutAndHoldsBackNoOther(t *testing.T) {
	t.Parallel()
	// The message: just under the source topic's 1 MiB, which the
	// letter's own headers push past the writer's limit.
	bigValue := randomBytes(t, 1_047_400)
	t.Run("AValueNearTheSourceTopicsLimit", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		dlq := e.deadLetterTopic(t, 0)
		e.producePoisonAround(t, kafka.Message{Key: []byte("big"), Value: bigValue,
			Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte("big")}, {Key: "trace", Value: []byte("t-1")}}})
		got := e.readLetters(t, dlq)
		big := got["big"]
		require.Equal(t, "value", header(big, consumer.HeaderTruncated))
		require.Less(t, len(big.Value), len(bigValue))
		require.True(t, bytes.HasPrefix(bigValue, big.Value), "the value published is the start of the message's")
		require.Equal(t, "t-1", header(big, "trace"), "the headers are kept when the value is enough to cut")
		requireCutLetter(t, e, big, len(bigValue))
		require.Equal(t, bigValue, e.letters()["big"].Value, "the whole message stays in dead_letters")
	})
	t.Run("HeadersNearTheSourceTopicsLimit", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		dlq := e.deadLetterTopic(t, 0)
		e.producePoisonAround(t, kafka.Message{Key: []byte("big"), Value: []byte("small"),
			Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte("big")}, {Key: "blob", Value: bigValue[:1_040_000]}, {Key: "trace", Value: []byte("t-1")}}})
		got := e.readLetters(t, dlq)
		big := got["big"]
		require.Equal(t, "headers", header(big, consumer.HeaderTruncated))
		require.Equal(t, "small", string(big.Value), "the value is kept when the headers are enough to cut")
		require.Empty(t, header(big, "blob"), "the huge header is left out")
		require.Equal(t, "t-1", header(big, "trace"), "the headers that fit are kept")
		requireCutLetter(t, e, big, 1_040_000)
		require.Len(t, e.letters()["big"].Headers[1].Value, 1_040_000, "the whole message stays in dead_letters")
	})
	t.Run("ATopicSmallerThanTheWritersLimit", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		// The writer cannot tell in advance: the broker refuses the letter,
		// in a batch with others, and then alone.
		const topicLimit = 64 << 10
		dlq := e.deadLetterTopic(t, topicLimit)
		value := bigValue[:200_000]
		e.producePoisonAround(t, kafka.Message{Key: []byte("big"), Value: value,
			Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte("big")}}})
		got := e.readLetters(t, dlq)
		big := got["big"]
		require.Equal(t, "value", header(big, consumer.HeaderTruncated))
		require.True(t, bytes.HasPrefix(value, big.Value), "the value published is the start of the message's")
		require.Less(t, len(big.Value), topicLimit)
		requireCutLetter(t, e, big, len(value))
		require.Contains(t, header(big, consumer.HeaderTruncatedReason), "max.message.bytes")
	})
}

// producePoisonAround writes poison messages p-0 and p-1, then big, then
// p-2 to p-4 and a good message, and runs the consumer, whose handler sets
// aside every message but the good one, until every letter is marked
// published: the letters behind big must not wait for it.
func (e *env) producePoisonAround(t *testing.T, big kafka.Message) {
	t.Helper()
	poison := func(from, to int) {
		for i := from; i < to; i++ {
			id := "p-" + strconv.Itoa(i)
			e.kafka.Produce(t, e.topic, msg(0, id, "poison "+id))
		}
	}
	poison(0, 2)
	e.kafka.Produce(t, e.topic, big)
	poison(2, 5)
	e.kafka.Produce(t, e.topic, msg(0, "ok", "fine"))
	apply := e.applyHandler()
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "big":
			// An error as long as the letter's header carries (a panic's
			// stack, say): with it the letter passes 1 MiB.
			return consumer.Permanent(errors.New("cannot apply big: " + strings.Repeat("what went wrong ", 100)))
		case m.ID != "ok":
			return consumer.Permanent(errors.New("cannot apply " + m.ID))
		}
		return apply.Handle(ctx, tx, m)
	}))
	cfg.DeadLetterTopic = e.topic + ".dlq"
	r := e.start(cfg)
	waitFor(t, 60*time.Second, "all six letters marked published", func() bool {
		ls := e.letters()
		published := 0
		for _, l := range ls {
			if l.PublishedAt != nil {
				published++
			}
		}
		return len(ls) == 6 && published == 6
	})
	r.stop()
	e.requireExactlyOnce([]string{"ok"})
}

// deadLetterTopic creates the test's dead-letter topic, with maxBytes as
// its max.message.bytes unless 0.
func (e *env) deadLetterTopic(t *testing.T, maxBytes int) string {
	t.Helper()
	dlq := e.topic + ".dlq"
	if maxBytes == 0 {
		require.NoError(t, devenv.CreateTopic(context.Background(), e.kafka.Brokers, dlq, 1))
		return dlq
	}
	limit := strconv.Itoa(maxBytes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := kadm.NewClient(e.kafka.Client(t)).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &limit}, dlq)
	require.NoError(t, err)
	return dlq
}

// readLetters reads the dead-letter topic until it has seen every letter
// of the test's consumer, and returns the first record of each by message
// id. Every record on the topic must be one of the letters.
func (e *env) readLetters(t *testing.T, dlq string) map[string]kafka.Message {
	t.Helper()
	letters := e.letters()
	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: e.kafka.Brokers, Topic: dlq, Partition: 0, MaxWait: 100 * time.Millisecond, MaxBytes: 4 << 20})
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := map[string]kafka.Message{}
	for len(got) < len(letters) {
		m, err := rd.ReadMessage(ctx)
		require.NoError(t, err, "read %d of %d letters", len(got), len(letters))
		id := header(m, consumer.DefaultMessageIDHeader)
		l, ok := letters[id]
		require.True(t, ok, "a record of no letter on the dead-letter topic: message id %q", id)
		require.Equal(t, strconv.FormatInt(l.ID, 10), header(m, consumer.HeaderDeadLetterID))
		if _, seen := got[id]; !seen {
			got[id] = m
		}
	}
	for id, m := range got {
		if id == "big" {
			continue
		}
		require.Empty(t, header(m, consumer.HeaderTruncated), "letter %s is published whole", id)
		require.Equal(t, "poison "+id, string(m.Value))
	}
	return got
}

// requireCutLetter checks what a cut letter says about itself: the
// original size, why, and the headers that say where it came from.
func requireCutLetter(t *testing.T, e *env, m kafka.Message, atLeast int) {
	t.Helper()
	size, err := strconv.Atoi(header(m, consumer.HeaderOriginalSize))
	require.NoError(t, err, "the original size")
	require.GreaterOrEqual(t, size, atLeast)
	require.True(t, strings.Contains(header(m, consumer.HeaderTruncatedReason), "larger than"), "the reason: %q", header(m, consumer.HeaderTruncatedReason))
	require.Equal(t, "big", string(m.Key))
	require.Equal(t, e.topic, header(m, consumer.HeaderSourceTopic))
	require.Equal(t, "2", header(m, consumer.HeaderSourceOffset))
	require.Equal(t, "permanent", header(m, consumer.HeaderErrorClass))
	require.Contains(t, header(m, consumer.HeaderError), "cannot apply big")
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// randomBytes does not compress, so a compressing writer cannot shrink it
// under a limit.
func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}
