package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// countingDB counts the relay's transactions (its rounds).
type countingDB struct {
	outbox.DB
	begins atomic.Int64
}

func (c *countingDB) Begin(ctx context.Context) (pgx.Tx, error) {
	c.begins.Add(1)
	return c.DB.Begin(ctx)
}

// startRelay runs a relay on db in the background until the test ends.
func startRelay(t *testing.T, db outbox.DB, schema string, cfg outbox.RelayConfig) {
	t.Helper()
	cfg.Schema = schema
	cfg.Logger = quiet
	cfg.KafkaClient = kafkaClient()
	r, err := outbox.NewRelay(db, &cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
}

// sameBucket returns a key other than key that hashes to key's bucket.
func sameBucket(key string) string {
	for i := 0; ; i++ {
		k := "other-" + strconv.Itoa(i)
		if outbox.BucketOf([]byte(k)) == outbox.BucketOf([]byte(key)) {
			return k
		}
	}
}

// A key waiting for its retry holds back only its own rows: another key of
// its bucket is delivered at once, and the relay, with nothing else to do,
// sleeps instead of running empty rounds.
func TestAWaitingKeyHoldsBackOnlyItsOwnRows(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	other := sameBucket("hot")
	var mu sync.Mutex
	delivered := map[string]time.Time{}
	deliver := func(_ context.Context, d *outbox.Delivery) error {
		if string(d.Key) == "hot" {
			return outbox.RetryAfter(errors.New("HTTP 429"), time.Hour)
		}
		mu.Lock()
		delivered[string(d.Value)] = time.Now()
		mu.Unlock()
		return nil
	}
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{Destination: "api", Key: []byte("hot"), Value: []byte("hot-" + strconv.Itoa(i))})
	}
	write(t, db, msgs...)
	cdb := &countingDB{DB: db.Pool}
	startRelay(t, cdb, db.Schema, outbox.RelayConfig{Deliver: deliver, BatchSize: 5})
	waitFor(t, func() bool {
		return db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")+` WHERE attempts = 1`) == 1
	}, "the hot key's first row to fail")

	// Rows written while the key waits, for it and for another key of its
	// bucket.
	write(t, db, outbox.Message{Destination: "api", Key: []byte("hot"), Value: []byte("hot-late")},
		outbox.Message{Destination: "api", Key: []byte(other), Value: []byte("other")})
	written, before := time.Now(), cdb.begins.Load()
	otherDelivered := func() bool { mu.Lock(); defer mu.Unlock(); return !delivered["other"].IsZero() }
	for !otherDelivered() && time.Since(written) < 2*time.Second {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d rounds in the %v after the rows were written", cdb.begins.Load()-before, time.Since(written).Round(time.Millisecond))
	require.True(t, otherDelivered(), "the other key's row, in the waiting key's bucket, was not delivered within 2s")
	mu.Lock()
	t.Logf("the other key's row delivered %v after it was written", delivered["other"].Sub(written).Round(time.Millisecond))
	require.Len(t, delivered, 1, "none of the waiting key's rows went")
	mu.Unlock()

	before = cdb.begins.Load()
	time.Sleep(time.Second)
	rounds := cdb.begins.Load() - before
	t.Logf("%d rounds in 1s with nothing due (PollInterval %v)", rounds, outbox.DefaultPollInterval)
	require.Less(t, rounds, int64(2*time.Second/outbox.DefaultPollInterval), "the relay spins with nothing due")
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")+` WHERE attempts > 0`), "only the key's head was attempted")
	require.EqualValues(t, 6, pending(t, db), "the waiting key's rows stay")
}

// A row with a key or a destination too large for an index entry (a third
// of a page) fails like any other: it waits for its retry, holding back
// only its own key's rows, and the relay goes on with the other keys. The
// index of waiting rows keeps neither, so marking it waiting cannot fail.
func TestARowWithALargeKeyWaitsLikeAnyOther(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	random := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 8000) // random: an index entry cannot compress it
	for i := range big {
		big[i] = byte(random.Uint32())
	}
	var d strings.Builder
	for range 4000 {
		d.WriteByte("abcdefghijklmnopqrstuvwxyz0123456789"[random.IntN(36)])
	}
	dest := "api-" + d.String()
	var mu sync.Mutex
	delivered := map[string]bool{}
	deliver := func(_ context.Context, d *outbox.Delivery) error {
		if bytes.Equal(d.Key, big) {
			return outbox.RetryAfter(errors.New("HTTP 503"), time.Hour)
		}
		mu.Lock()
		delivered[string(d.Value)] = true
		mu.Unlock()
		return nil
	}
	write(t, db, outbox.Message{Destination: dest, Key: big, Value: []byte("big")},
		outbox.Message{Destination: "api", Key: []byte("small"), Value: []byte("small")})
	startRelay(t, db.Pool, db.Schema, outbox.RelayConfig{Deliver: deliver})
	waitFor(t, func() bool {
		return db.Int(t, `SELECT count(*) FROM `+db.Table("outbox")+` WHERE attempts = 1 AND next_attempt_at > now()`) == 1
	}, "the large key's row to wait for its retry")
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return delivered["small"] }, "the other key's row to be delivered")
	require.EqualValues(t, 1, pending(t, db), "the large key's row waits")
}

// ownKafka is an in-process broker of the test's own, whose requests the
// test may intercept.
func ownKafka(t *testing.T) *testenv.Kafka {
	t.Helper()
	k, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Close() })
	return &testenv.Kafka{Kafka: k}
}

// firstOccurrences lists the values of key's messages in the order they
// first appear (a retried message may appear twice).
func firstOccurrences(msgs []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range msgs {
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	return out
}

// A key's messages larger together than a request to one partition go in
// several requests; when the first fails, the later ones must not go
// before it.
func TestKafkaKeepsAKeysOrderWhenItsFirstRequestFails(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := ownKafka(t)
	topic := k.Topic(t, 1)
	k.RefuseProduce("a-0:", kerr.NotEnoughReplicas.Code, false)
	var msgs []outbox.Message
	for i := range 4 {
		v := append([]byte("a-"+strconv.Itoa(i)+":"), bytes.Repeat([]byte("x"), 400<<10)...)
		msgs = append(msgs, outbox.Message{Destination: topic, Key: []byte("a"), Value: v})
	}
	write(t, db, msgs...)
	runRelay(t, db, outbox.RelayConfig{Brokers: k.Brokers, RetryInitialInterval: 10 * time.Millisecond, RetryMaxInterval: 50 * time.Millisecond,
		MinRetriesPerMinute: 1000})
	waitFor(t, func() bool { return pending(t, db) == 0 }, "all published")
	got := readAll(t, k.Brokers, topic, 4)
	var order []string
	for _, m := range got {
		order = append(order, strings.SplitN(string(m.Value), ":", 2)[0])
	}
	require.Equal(t, []string{"a-0", "a-1", "a-2", "a-3"}, firstOccurrences(order), "key a's messages in the topic, in the order they first appear")
}

// A message that can never fit is parked at its first attempt, with the
// reason, and the key's later rows follow it: one larger than the relay
// sends in a request, and one the broker rejects as larger than the topic
// allows.
func TestKafkaParksAMessageThatCanNeverFitAtOnce(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	k := ownKafka(t)
	topic := k.Topic(t, 1)
	k.RefuseProduce("huge", kerr.MessageTooLarge.Code, true)
	write(t, db,
		outbox.Message{Destination: topic, Key: []byte("big"), Value: append([]byte("big-0:"), make([]byte, 2<<20)...)},
		outbox.Message{Destination: topic, Key: []byte("big"), Value: []byte("big-1:")},
		outbox.Message{Destination: topic, Key: []byte("b"), Value: []byte("b-0:huge")},
		outbox.Message{Destination: topic, Key: []byte("b"), Value: []byte("b-1:")},
		outbox.Message{Destination: topic, Key: []byte("ok"), Value: []byte("ok-0:")})
	runRelay(t, db, outbox.RelayConfig{Brokers: k.Brokers, RetryInitialInterval: 10 * time.Millisecond, RetryMaxInterval: 50 * time.Millisecond,
		MinRetriesPerMinute: 1000})
	waitFor(t, func() bool { return pending(t, db) == 0 }, "every row published or parked")
	o, _ := outbox.New(db.Schema)
	parked, err := o.Parked(context.Background(), db.Pool, 10)
	require.NoError(t, err)
	var parkedValues []string
	for _, p := range parked {
		parkedValues = append(parkedValues, strings.SplitN(string(p.Value), ":", 2)[0])
	}
	require.ElementsMatch(t, []string{"big-0", "b-0"}, parkedValues, "parked")
	for _, p := range parked {
		require.Equal(t, 1, p.Attempts, "%s parked at its first attempt: %s", p.Key, p.LastError)
		require.Contains(t, p.LastError, "can never be published", "%s", p.Key)
	}

	got := readAll(t, k.Brokers, topic, 3)
	var order []string
	for _, m := range got {
		order = append(order, strings.SplitN(string(m.Value), ":", 2)[0])
	}
	require.ElementsMatch(t, []string{"big-1", "b-1", "ok-0"}, firstOccurrences(order))
}

// Other ways a row's record can never fit are parked at once too, and
// hold back only their own key: headers that take the request past
// BatchBytes (the value is small), and a record the broker refuses as
// larger than the topic's segment.bytes (RECORD_LIST_TOO_LARGE), which no
// retry mends.
func TestKafkaParksAtOnceARowThatCanNeverFitInAnyWay(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		huge outbox.Message
		code int16 // the broker's answer to "huge", or 0
	}{
		{name: "HeadersOverTheRequestLimit", huge: outbox.Message{Value: []byte("huge-0:"), Headers: []outbox.Header{{Key: "blob", Value: make([]byte, 1<<20)}}}},
		{name: "LargerThanTheTopicsSegment", huge: outbox.Message{Value: []byte("huge-0:")}, code: kerr.RecordListTooLarge.Code},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t)
			k := ownKafka(t)
			topic := k.Topic(t, 1)
			if c.code != 0 {
				k.RefuseProduce("huge-0:", c.code, true)
			}
			huge := c.huge
			huge.Destination, huge.Key = topic, []byte("huge")
			write(t, db, huge,
				outbox.Message{Destination: topic, Key: []byte("huge"), Value: []byte("huge-1:")},
				outbox.Message{Destination: topic, Key: []byte("ok"), Value: []byte("ok-0:")})
			runRelay(t, db, outbox.RelayConfig{Brokers: k.Brokers, RetryInitialInterval: 10 * time.Millisecond, RetryMaxInterval: 50 * time.Millisecond,
				MinRetriesPerMinute: 1000})
			waitFor(t, func() bool { return pending(t, db) == 0 }, "every row published or parked")
			o, _ := outbox.New(db.Schema)
			parked, err := o.Parked(context.Background(), db.Pool, 10)
			require.NoError(t, err)
			require.Len(t, parked, 1)
			require.Equal(t, "huge-0:", string(parked[0].Value))
			require.Equal(t, 1, parked[0].Attempts, "parked at its first attempt: %s", parked[0].LastError)
			require.Contains(t, parked[0].LastError, "can never be published")
			var order []string
			for _, m := range readAll(t, k.Brokers, topic, 2) {
				order = append(order, strings.SplitN(string(m.Value), ":", 2)[0])
			}
			require.ElementsMatch(t, []string{"huge-1", "ok-0"}, firstOccurrences(order))
		})
	}
}

// A Deliver that hangs, its context ignored, is cut off after
// DeliveryTimeout and its grace: the round commits, its bucket is free for
// the other keys, and the row is retried.
func TestAHungDeliverIsCutOffAndRetried(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	other := sameBucket("hung")
	release := make(chan struct{})
	var mu sync.Mutex
	calls := map[string]int{}
	delivered := map[string]bool{}
	deliver := func(_ context.Context, d *outbox.Delivery) error {
		mu.Lock()
		calls[string(d.Value)]++
		n := calls[string(d.Value)]
		mu.Unlock()
		if string(d.Value) == "hung" && n == 1 {
			<-release // ignores its context
			return nil
		}
		mu.Lock()
		delivered[string(d.Value)] = true
		mu.Unlock()
		return nil
	}
	write(t, db, outbox.Message{Destination: "api", Key: []byte("hung"), Value: []byte("hung")})
	startRelay(t, db.Pool, db.Schema, outbox.RelayConfig{Deliver: deliver, DeliveryTimeout: 200 * time.Millisecond,
		RetryInitialInterval: 10 * time.Millisecond, RetryMaxInterval: 50 * time.Millisecond, MinRetriesPerMinute: 1000})
	t.Cleanup(func() { close(release) }) // runs before the relay is stopped
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return calls["hung"] == 1 }, "the first call")
	write(t, db, outbox.Message{Destination: "api", Key: []byte(other), Value: []byte("other")})

	isDelivered := func(v string) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return delivered[v] }
	}
	require.Eventually(t, isDelivered("other"), 6*time.Second, 10*time.Millisecond, "the bucket stayed locked by the hung call")
	require.Eventually(t, isDelivered("hung"), 6*time.Second, 10*time.Millisecond, "the hung row was not retried")
	mu.Lock()
	require.Equal(t, 2, calls["hung"], "retried once")
	mu.Unlock()
	waitFor(t, func() bool { return pending(t, db) == 0 }, "both rows deleted")
}
