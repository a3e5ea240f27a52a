package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/dedupe"
)

type suspectRecorder struct {
	mu  sync.Mutex
	got map[string]consumer.SuspectOf
}

func (s *suspectRecorder) OnSuspectDuplicate(_ context.Context, m *consumer.Message, first consumer.SuspectOf) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got == nil {
		s.got = map[string]consumer.SuspectOf{}
	}
	s.got[m.ID] = first
}

// retryingProducer writes a transfer, then "retries" it under a new id, as
// a producer that mints the id inside its retry loop does.
func retryingProducer(e *env) {
	same := func(id string) kafka.Message { return msg(0, id, `{"from":"a","to":"b","amount":10}`) }
	m1, m2 := same("t-1"), same("t-1-retry")
	m2.Key = m1.Key // the retry reuses the key; only the id is new
	e.kafka.Produce(e.t, e.topic, m1, msg(0, "other", `{"amount":5}`), m2)
}

func TestSuspectDuplicatesAreReportedByDefault(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	retryingProducer(e)
	rec := &suspectRecorder{}
	cfg := e.config(e.applyHandler())
	cfg.Hooks = append(cfg.Hooks, rec)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	r.stop()

	e.requireExactlyOnce([]string{"t-1", "other", "t-1-retry"})
	require.Equal(t, "t-1", rec.got["t-1-retry"].MessageID)
	require.EqualValues(t, 0, rec.got["t-1-retry"].Offset)
	s, _ := dedupe.NewStore(e.db.Schema)
	sus, err := s.Suspects(context.Background(), e.db.Pool, e.name, 10)
	require.NoError(t, err)
	require.Len(t, sus, 1)
	require.Equal(t, "t-1-retry", sus[0].MessageID)
	require.Equal(t, "t-1", sus[0].FirstMessageID)
	require.False(t, sus[0].Skipped)
}

func TestSuspectDuplicatesCanBeSkipped(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	retryingProducer(e)
	cfg := e.config(e.applyHandler())
	cfg.SuspectDuplicates = consumer.SkipSuspects
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	r.stop()

	e.requireExactlyOnce([]string{"t-1", "other"})
	require.Equal(t, "suspect_duplicate", e.claimStatus("t-1-retry"))
	require.Equal(t, 1, e.events.snapshot().skipped[consumer.SkipSuspectDuplicate])
	s, _ := dedupe.NewStore(e.db.Schema)
	sus, err := s.Suspects(context.Background(), e.db.Pool, e.name, 10)
	require.NoError(t, err)
	require.Len(t, sus, 1)
	require.True(t, sus[0].Skipped)
}

func TestSuspectDetectionCanBeTurnedOff(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	retryingProducer(e)
	rec := &suspectRecorder{}
	cfg := e.config(e.applyHandler())
	cfg.SuspectDuplicateWindow = consumer.LeaveUnset
	cfg.SuspectDuplicates = consumer.SkipSuspects
	cfg.Hooks = append(cfg.Hooks, rec)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	r.stop()
	e.requireExactlyOnce([]string{"t-1", "other", "t-1-retry"})
	require.Empty(t, rec.got)
}
