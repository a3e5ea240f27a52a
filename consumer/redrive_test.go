package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
)

func TestRedriveAppliesALetterOnceHoweverOftenItRuns(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("r", 6)
	var fixed atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if (m.ID == "r-2" || m.ID == "r-4") && !fixed.Load() {
			return consumer.Permanent(errors.New("rejected by the partner"))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 6}, 30*time.Second)
	r.stop()
	require.Len(t, e.letters(), 2)

	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	ctx := context.Background()

	// Still broken: the letters stay.
	res, err := c.Redrive(ctx, consumer.RedriveFilter{})
	require.NoError(t, err)
	require.Len(t, res.Failed, 2)
	require.ErrorContains(t, res.Failed[0], "rejected by the partner")
	require.Zero(t, res.Applied)
	require.Nil(t, e.letters()["r-2"].RedrivenAt)

	// Fixed: two redrives race for the same letters.
	fixed.Store(true)
	var wg sync.WaitGroup
	results := make([]consumer.RedriveResult, 2)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			results[i], err = c.Redrive(ctx, consumer.RedriveFilter{})
			assert.NoError(t, err)
		}()
	}
	wg.Wait()
	require.Equal(t, 2, results[0].Applied+results[1].Applied)
	require.Empty(t, results[0].Failed)
	require.Empty(t, results[1].Failed)

	// And once more for good measure.
	res, err = c.Redrive(ctx, consumer.RedriveFilter{IDs: []int64{e.letters()["r-2"].ID}})
	require.NoError(t, err)
	require.Equal(t, consumer.RedriveResult{}, res, "a redriven letter is not pending any more")

	e.requireExactlyOnce(ids)
	require.NotNil(t, e.letters()["r-2"].RedrivenAt)
	require.Equal(t, "applied", e.claimStatus("r-2"))

	// A rewind after the redrive applies nothing again.
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 0})
	e.db.Exec(t, `DELETE FROM `+e.db.Table("consumer_offsets"))
	r = e.start(cfg)
	waitFor(t, 30*time.Second, "the replay", func() bool { return e.storedPositions()[0] == 6 })
	r.stop()
	e.requireExactlyOnce(ids)
}

func TestRedriveOfAnInvalidIDWithAFixedIDFunction(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.kafka.Produce(t, e.topic, kafka.Message{Key: []byte("k"), Value: []byte(`{"id":"from-json"}`)})
	cfg := e.config(e.applyHandler())
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
	r.stop()
	require.Equal(t, deadletter.ClassInvalidID, e.letters()["offset:0"].Class)

	// The producer puts ids in the JSON body, not in a header: the operator
	// redrives with the right MessageID.
	cfg.MessageID = consumer.IDFromJSONField("id")
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	res, err := c.Redrive(context.Background(), consumer.RedriveFilter{Class: deadletter.ClassInvalidID})
	require.NoError(t, err)
	require.Equal(t, 1, res.Applied)
	e.requireExactlyOnce([]string{"from-json"})
	require.Equal(t, "applied", e.claimStatus("from-json"))
}

func TestRedriveRefusesAConflict(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.kafka.Produce(t, e.topic, msg(0, "x", "first"), msg(0, "x", "second"))
	cfg := e.config(e.applyHandler())
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 2}, 30*time.Second)
	r.stop()
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	res, err := c.Redrive(context.Background(), consumer.RedriveFilter{})
	require.NoError(t, err)
	require.Len(t, res.Failed, 1)
	require.ErrorIs(t, res.Failed[0].Err, consumer.ErrFingerprintConflict)
	require.Equal(t, "first", e.effectValue("x"))
}

func TestDeadLettersArePublishedToTheDeadLetterTopic(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	dlq := e.topic + ".dlq"
	require.NoError(t, devenv.CreateTopic(context.Background(), e.kafka.Brokers, dlq, 1))
	e.kafka.Produce(t, e.topic, msg(0, "ok", "fine"),
		kafka.Message{Key: []byte("k1"), Value: []byte("poison"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("bad")}, {Key: "trace", Value: []byte("abc")}}})
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "bad" {
			return consumer.Permanent(errors.New("cannot apply"))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.DeadLetterTopic = dlq
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "the letter published", func() bool {
		l, ok := e.letters()["bad"]
		return ok && l.PublishedAt != nil
	})
	r.stop()

	rd := kafka.NewReader(kafka.ReaderConfig{Brokers: e.kafka.Brokers, Topic: dlq, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer rd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := rd.ReadMessage(ctx)
	require.NoError(t, err)
	require.Equal(t, "poison", string(m.Value))
	require.Equal(t, "k1", string(m.Key))
	headers := map[string]string{}
	for _, h := range m.Headers {
		headers[h.Key] = string(h.Value)
	}
	require.Equal(t, "bad", headers[consumer.DefaultMessageIDHeader])
	require.Equal(t, "abc", headers["trace"])
	require.Equal(t, e.topic, headers[consumer.HeaderSourceTopic])
	require.Equal(t, "0", headers[consumer.HeaderSourcePartition])
	require.Equal(t, "1", headers[consumer.HeaderSourceOffset])
	require.Equal(t, "permanent", headers[consumer.HeaderErrorClass])
	require.Contains(t, headers[consumer.HeaderError], "cannot apply")
	require.Equal(t, strconv.FormatInt(e.letters()["bad"].ID, 10), headers[consumer.HeaderDeadLetterID])
	e.requireExactlyOnce([]string{"ok"})
}

func TestStopPartitionPolicyStopsInsteadOfSettingAside(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("s", 4)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "s-1" {
			return errors.New("still failing")
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.OnPermanentFailure = consumer.StopPartition
	cfg.Retry.MaxAttempts = 2
	cfg.Retry.InitialInterval = time.Millisecond
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "the partition stopped", func() bool { return len(e.events.snapshot().stopped) == 1 })
	r.stop()
	e.requireExactlyOnce([]string{"s-0"})
	require.Empty(t, e.letters())
	require.ErrorContains(t, e.events.snapshot().stopped[0], "still failing")
	require.Equal(t, map[int]int64{0: 1}, e.storedPositions())
}

// Redrive may be called from any goroutine, while Run is starting up and
// settling its session settings (run with -race).
func TestRedriveWhileRunStarts(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("x", 1)
	cfg := e.config(consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
		return consumer.Permanent(errors.New("rejected"))
	}))
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
	r.stop()

	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for range 20 {
		res, err := c.Redrive(context.Background(), consumer.RedriveFilter{})
		require.NoError(t, err)
		require.Len(t, res.Failed, 1, "the letter's redrive ran, and failed")
	}
	cancel()
	require.NoError(t, <-done)
}
