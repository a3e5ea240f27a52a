package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// The hooks get the engine's values through struct conversions: every field
// of BatchInfo, BatchResult, PartitionAssignment, Failure, DeadLettered,
// SkipReason and the offsets committed must say what happened. Phase one:
// new messages, a repeat inside the batch and a re-send after it; phase
// two: a message that fails twice and then passes, a permanent failure and
// a panic.
func TestHookPayloadsSayWhatHappened(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		var mu sync.Mutex
		calls := map[string]int{}
		apply := e.applyHandler()
		h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			mu.Lock()
			calls[m.ID]++
			n := calls[m.ID]
			mu.Unlock()
			switch m.ID {
			case "flaky":
				if n <= 2 {
					return errors.New("partner down")
				}
			case "poison":
				return consumer.Permanent(errors.New("never valid"))
			case "panics":
				panic("handler boom")
			}
			return apply.Handle(ctx, tx, m)
		})
		cfg := e.config(h)
		if batched {
			cfg.Handler, cfg.BatchHandler = nil, eachMessage(h)
		}
		cfg.MaxWait = 50 * time.Millisecond
		cfg.Retry.MaxAttempts = 5
		tp := withTap(cfg)
		before := time.Now().Add(-time.Minute)

		// Phase one: a-0..a-5, with a-2 again (same id and content) at the
		// end of the same produce, then a re-send of a-4 later.
		var first []kafka.Message
		for i := 0; i < 6; i++ {
			id := "a-" + itoa(int64(i))
			first = append(first, msg(0, id, "v-"+id))
		}
		first = append(first, msg(0, "a-2", "v-a-2")) // offset 6
		e.kafka.Produce(t, e.topic, first...)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 7}, 30*time.Second)
		e.kafka.Produce(t, e.topic, msg(0, "a-4", "v-a-4")) // offset 7
		e.waitCommitted(map[int]int64{0: 8}, 30*time.Second)

		// Phase two.
		e.kafka.Produce(t, e.topic, msg(0, "b-0", "v-b-0"), msg(0, "flaky", "v-flaky"), msg(0, "poison", "v-poison"),
			msg(0, "panics", "v-panics"), msg(0, "b-1", "v-b-1")) // offsets 8..12
		e.waitCommitted(map[int]int64{0: 13}, 30*time.Second)
		r.stop()

		s := tp.snap()
		e.requireExactlyOnce([]string{"a-0", "a-1", "a-2", "a-3", "a-4", "a-5", "b-0", "flaky", "b-1"})
		e.check(expectation{ids: []string{"a-0", "a-1", "a-2", "a-3", "a-4", "a-5", "b-0", "flaky", "poison", "panics", "b-1"},
			poison: []string{"poison", "panics"}})

		// Assignment.
		require.Len(t, s.assigned, 1)
		a := s.assigned[0]
		require.Equal(t, consumer.PartitionAssignment{Topic: e.topic, Partition: 0, KafkaOffset: -1, StoredPosition: -1,
			LogStart: 0, LogEnd: a.LogEnd, Start: 0}, a)
		require.GreaterOrEqual(t, a.LogEnd, int64(7))

		// Batches: each committed one's info is consistent, and the
		// results add up.
		require.Equal(t, len(s.starts), len(s.ends), "a start and an end per transaction")
		applied, skipped := 0, 0
		for i, end := range s.ends {
			b := end.info
			require.Equal(t, s.starts[i], b, "the start and the end of a transaction describe the same batch")
			require.Equal(t, e.topic, b.Topic)
			require.Equal(t, 0, b.Partition)
			require.Equal(t, b.LastOffset-b.FirstOffset+1, int64(b.Size), "%+v", b)
			require.LessOrEqual(t, b.Size, b.BatchLimit, "%+v", b)
			require.Equal(t, 100, b.BatchLimit, "no contention: BatchLimit is MaxBatch")
			require.False(t, b.Serialized)
			require.GreaterOrEqual(t, b.Attempt, 1)
			require.Greater(t, b.HighWaterMark, b.LastOffset, "%+v", b)
			require.Positive(t, end.res.Duration)
			// A savepoint transaction cut short at a failing message
			// commits the messages before it and reports them with the
			// failure's Err, so count every transaction's results.
			require.LessOrEqual(t, end.res.Applied+end.res.Skipped, b.Size)
			applied += end.res.Applied
			skipped += end.res.Skipped
		}
		require.Equal(t, len(s.applied), applied, "BatchResult.Applied adds up to the messages applied")
		require.Equal(t, len(s.skipped), skipped, "BatchResult.Skipped adds up to the messages skipped")
		require.Len(t, s.applied, 9)

		// Applied messages carry every field.
		for _, m := range s.applied {
			require.Equal(t, e.topic, m.Topic)
			require.Equal(t, 0, m.Partition)
			require.Equal(t, string(m.Key), m.ID)
			require.Equal(t, "v-"+m.ID, string(m.Value))
			require.Len(t, m.Headers, 1)
			require.Equal(t, consumer.DefaultMessageIDHeader, m.Headers[0].Key)
			require.Equal(t, m.ID, string(m.Headers[0].Value))
			require.True(t, m.Time.After(before), "the message time is Kafka's: %v", m.Time)
		}

		// Skips: the repeat at 6 and the re-send at 7, each with its reason.
		require.Len(t, s.skipped, 2)
		reasons := map[int64]consumer.SkipReason{}
		for _, sk := range s.skipped {
			require.Equal(t, sk.msg.ID, string(sk.msg.Key))
			reasons[sk.msg.Offset] = sk.reason
		}
		require.Equal(t, consumer.SkipAlreadyClaimed, reasons[7], "a re-send of a committed message")
		var sameTx bool
		for _, end := range s.ends {
			if end.res.Err == nil && end.info.FirstOffset <= 2 && end.info.LastOffset >= 6 {
				sameTx = true
			}
		}
		if sameTx {
			require.Equal(t, consumer.SkipDuplicateInBatch, reasons[6], "a repeat of an earlier message of the same transaction")
		} else {
			require.Equal(t, consumer.SkipAlreadyClaimed, reasons[6])
		}

		// Failures: flaky twice (transient, counted), poison once
		// (permanent), panics once (panic).
		fl := s.failedFor(9)
		if batched {
			// The BatchHandler's first failing call covered several
			// messages: not an attempt of any (the messages then go one
			// per call, and flaky's next failure is its first attempt).
			require.NotEmpty(t, fl)
			require.LessOrEqual(t, len(fl), 2)
		} else {
			require.Len(t, fl, 2, "flaky failed twice")
		}
		for i, f := range fl {
			require.Equal(t, deadletter.ClassRetriesExhausted, f.f.Class)
			require.False(t, f.f.Permanent)
			require.Equal(t, i+1, f.f.Attempt, "attempts count from 1")
			var merr *consumer.MessageError
			require.True(t, errors.As(f.f.Err, &merr), "%T", f.f.Err)
			require.Equal(t, "flaky", merr.MessageID)
			require.EqualValues(t, 9, merr.Offset)
			require.ErrorContains(t, f.f.Err, "partner down")
		}
		require.Empty(t, s.deadFor(9))

		po := s.failedFor(10)
		require.Len(t, po, 1)
		require.Equal(t, deadletter.ClassPermanent, po[0].f.Class)
		require.True(t, po[0].f.Permanent)
		require.Equal(t, 1, po[0].f.Attempt)
		pd := s.deadFor(10)
		require.Len(t, pd, 1)
		require.Equal(t, consumer.DeadLettered{Class: deadletter.ClassPermanent, Err: pd[0].d.Err, Attempts: 1}, pd[0].d)
		require.ErrorContains(t, pd[0].d.Err, "never valid")

		pa := s.failedFor(11)
		require.Len(t, pa, 1)
		require.Equal(t, deadletter.ClassPanic, pa[0].f.Class)
		require.True(t, pa[0].f.Permanent)
		require.ErrorIs(t, pa[0].f.Err, consumer.ErrHandlerPanicked)
		pad := s.deadFor(11)
		require.Len(t, pad, 1)
		require.Equal(t, deadletter.ClassPanic, pad[0].d.Class)

		letters := e.letters()
		require.Len(t, letters, 2)
		require.Equal(t, deadletter.ClassPermanent, letters["poison"].Class)
		require.Equal(t, deadletter.ClassPanic, letters["panics"].Class)

		// Handler-end hooks: one per message per call, never fewer than
		// the messages applied.
		require.GreaterOrEqual(t, len(s.handlerEnd), 9)

		// Offsets committed: never ahead of the stored position (the
		// watch in setup checks each commit), and the last reaches 13.
		require.NotEmpty(t, s.committed)
		last := s.committed[len(s.committed)-1]
		require.Equal(t, []consumer.TopicPartitionOffset{{Topic: e.topic, Partition: 0, Offset: 13}}, last)
		if e.commits != nil { // watched with the in-process broker only
			e.commits.mu.Lock()
			require.Empty(t, e.commits.violations)
			e.commits.mu.Unlock()
		}
	})
}

// HookMessageFailed's documentation promises a call for every failed
// attempt, "or the message could not be handled at all (an invalid id, a
// fingerprint conflict)". Under DeadLetter both are set aside (and
// reported to HookMessageDeadLettered), but are they reported as failures?
func TestFailureHookSeesInvalidIDsAndConflicts(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.kafka.Produce(t, e.topic,
		msg(0, "x", "first"),
		kafka.Message{Key: []byte("no-id"), Value: []byte("v")}, // no message-id header: invalid id
		msg(0, "x", "second"), // id reused for other content: conflict
		msg(0, "y", "fine"))
	cfg := e.config(e.applyHandler())
	tp := withTap(cfg)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	r.stop()

	s := tp.snap()
	require.Len(t, s.deadFor(1), 1)
	require.Len(t, s.deadFor(2), 1)
	require.Equal(t, deadletter.ClassInvalidID, s.deadFor(1)[0].d.Class)
	require.Equal(t, deadletter.ClassConflict, s.deadFor(2)[0].d.Class)
	require.Len(t, s.conflicts, 1)

	inv := s.failedFor(1)
	require.Len(t, inv, 1, "HookMessageFailed for the message without a valid id")
	require.Equal(t, deadletter.ClassInvalidID, inv[0].f.Class)
	require.True(t, inv[0].f.Permanent)
	require.ErrorIs(t, inv[0].f.Err, consumer.ErrInvalidMessageID)
	cf := s.failedFor(2)
	require.Len(t, cf, 1, "HookMessageFailed for the message whose id was reused")
	require.Equal(t, deadletter.ClassConflict, cf[0].f.Class)
	require.True(t, cf[0].f.Permanent)
	require.ErrorIs(t, cf[0].f.Err, consumer.ErrFingerprintConflict)
}
