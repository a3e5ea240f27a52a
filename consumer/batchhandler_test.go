package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// batchEffects is a BatchHandler that records every message as one effect
// row, with a single queued statement per call, and remembers what it was
// called with.
type batchEffects struct {
	e *env
	// before runs first; a non-nil error is returned as the call's.
	before func(msgs []*consumer.Message) error
	// extra, when set, queues one more statement per call.
	extra func(b *consumer.Batch)
	// read makes each call read through Batch.Tx (one round trip).
	read bool

	mu      sync.Mutex
	calls   int
	largest int
	seenIDs map[string]int
}

func (h *batchEffects) HandleBatch(ctx context.Context, b *consumer.Batch) error {
	h.mu.Lock()
	h.calls++
	h.largest = max(h.largest, len(b.Messages))
	if h.seenIDs == nil {
		h.seenIDs = map[string]int{}
	}
	for _, m := range b.Messages {
		h.seenIDs[m.ID]++
	}
	h.mu.Unlock()
	if h.before != nil {
		if err := h.before(b.Messages); err != nil {
			return err
		}
	}
	if h.read {
		var one int
		if err := b.Tx.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			return err
		}
	}
	ids := make([]string, len(b.Messages))
	parts := make([]int32, len(b.Messages))
	offs := make([]int64, len(b.Messages))
	values := make([]string, len(b.Messages))
	for i, m := range b.Messages {
		ids[i], parts[i], offs[i], values[i] = m.ID, int32(m.Partition), m.Offset, string(m.Value)
	}
	b.Queue(`INSERT INTO `+h.e.db.Table("effects")+` (message_id, topic, partition, kafka_offset, value)
SELECT id, $1, p, o, v FROM unnest($2::text[], $3::int[], $4::bigint[], $5::text[]) AS u(id, p, o, v)`,
		h.e.topic, ids, parts, offs, values)
	if h.extra != nil {
		h.extra(b)
	}
	return nil
}

func batchConfig(e *env, h consumer.BatchHandler) *consumer.Config {
	cfg := e.config(nil)
	cfg.Handler, cfg.BatchHandler = nil, h
	return cfg
}

// checkedConfig is e's config applying each message once after check
// passed it: with a Handler, a message fails with check's error; batched,
// with a BatchHandler, the call fails with the first message's error.
func (e *env) checkedConfig(batched bool, check func(*consumer.Message) error) *consumer.Config {
	if batched {
		return batchConfig(e, &batchEffects{e: e, before: func(msgs []*consumer.Message) error {
			for _, m := range msgs {
				if err := check(m); err != nil {
					return err
				}
			}
			return nil
		}})
	}
	apply := e.applyHandler()
	return e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := check(m); err != nil {
			return err
		}
		return apply.Handle(ctx, tx, m)
	}))
}

// Producer re-sends (the same ids and content again, later in the log) are
// applied once, whether batches claim first or are tried in one round trip
// (where an attempt holding a re-send is dropped and the batch runs again
// claim-first). Claiming first, the handler never sees a re-send at all.
func TestBatchHandlerAppliesEachMessageOnce(t *testing.T) {
	t.Parallel()
	bothWays(t, batchPaths, func(t *testing.T, claimFirst bool) {
		e := setup(t, 2)
		ids := e.produceIDs("b", 300)
		var again []kafka.Message
		for i := 0; i < 300; i += 10 {
			again = append(again, msg(i%2, ids[i], "v-"+ids[i]))
		}
		e.kafka.Produce(t, e.topic, again...)

		h := &batchEffects{e: e}
		cfg := batchConfig(e, h)
		cfg.ClaimFirst = claimFirst
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 180, 1: 150}, 30*time.Second) // the re-sends all went to partition 0
		r.stop()

		e.requireExactlyOnce(ids)
		e.check(expectation{ids: ids})
		h.mu.Lock()
		defer h.mu.Unlock()
		require.Greater(t, h.largest, 1, "messages were handled in batches")
		if claimFirst {
			for id, n := range h.seenIDs {
				require.Equalf(t, 1, n, "message %s was passed to the handler once (duplicates are not)", id)
			}
		}
		require.Equal(t, 330-30, e.events.snapshot().applied)
		skipped := e.events.snapshot().skipped
		require.Equal(t, 30, skipped[consumer.SkipAlreadyClaimed]+skipped[consumer.SkipDuplicateInBatch])
	})
}

func TestBatchHandlerFailureIsIsolated(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	var msgs []kafka.Message
	var ids, poison []string
	for i := range 200 {
		id := "g-" + strconv.Itoa(i)
		switch {
		case i%50 == 7:
			id = "p-" + strconv.Itoa(i) // the handler refuses it
			poison = append(poison, id)
		case i%50 == 33:
			id = "q-" + strconv.Itoa(i) // its queued statement fails
			poison = append(poison, id)
		}
		ids = append(ids, id)
		msgs = append(msgs, msg(0, id, "v-"+id))
	}
	// One message fails transiently twice, then passes.
	const flaky = "g-120"
	var flakyMu sync.Mutex
	flakyLeft := 2
	h := &batchEffects{e: e}
	h.before = func(ms []*consumer.Message) error {
		for _, m := range ms {
			if strings.HasPrefix(m.ID, "p-") {
				return consumer.Permanent(errors.New("refused " + m.ID))
			}
			if m.ID == flaky {
				flakyMu.Lock()
				defer flakyMu.Unlock()
				if flakyLeft > 0 {
					flakyLeft--
					return errors.New("provider busy")
				}
			}
		}
		return nil
	}
	h.extra = func(b *consumer.Batch) {
		for _, m := range b.Messages {
			if strings.HasPrefix(m.ID, "q-") {
				b.Queue(`SELECT 1 / 0`) // SQLSTATE 22012: fails the same way every time
			}
		}
	}
	e.kafka.Produce(t, e.topic, msgs...)
	cfg := batchConfig(e, h)
	cfg.Retry.MaxAttempts = 5
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 200}, 60*time.Second)
	r.stop()

	e.check(expectation{ids: ids, poison: poison})
	var good []string
	for _, id := range ids {
		if !strings.HasPrefix(id, "p-") && !strings.HasPrefix(id, "q-") {
			good = append(good, id)
		}
	}
	e.requireExactlyOnce(good)
	require.Zero(t, flakyLeft, "the flaky message was retried until it passed")
	require.EqualValues(t, 4, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE message_id LIKE 'p-%' AND error_class = 'permanent'`))
	require.EqualValues(t, 4, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE message_id LIKE 'q-%' AND error_class = 'data'`))
}

func TestConfigHandlerAndBatchHandler(t *testing.T) {
	base := func() *consumer.Config {
		return &consumer.Config{Name: "n", Brokers: []string{"localhost:9092"}, Topics: []string{"t"}}
	}
	cfg := base()
	cfg.Handler = consumer.HandlerFunc(nil)
	cfg.BatchHandler = consumer.BatchHandlerFunc(nil)
	_, err := consumer.New(unusedPool(t), cfg)
	require.ErrorContains(t, err, "Handler and BatchHandler are both set")

	cfg = base()
	cfg.BatchHandler = consumer.BatchHandlerFunc(func(context.Context, *consumer.Batch) error { return nil })
	_, err = consumer.New(unusedPool(t), cfg)
	require.NoError(t, err)
}

// A BatchHandler call that ignores its context is abandoned after
// HandlerTimeout, and the batch runs again. When the abandoned call finally
// queues its statements, they must land nowhere: not in the transaction
// running by then, which would apply its messages a second time.
func TestAnAbandonedBatchHandlerCannotQueueIntoALaterTransaction(t *testing.T) {
	t.Parallel()
	bothWays(t, batchPaths, func(t *testing.T, claimFirst bool) {
		e := setup(t, 1)
		ids := e.produceIDs("a", 5)
		release := make(chan struct{})
		queuedLate := make(chan struct{})
		var calls atomic.Int32
		h := &batchEffects{e: e}
		cfg := batchConfig(e, consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
			switch calls.Add(1) {
			case 1:
				<-release // ignores its context, so it is abandoned
				err := h.HandleBatch(ctx, b)
				close(queuedLate)
				return err
			case 2:
				// The next call lets the abandoned one queue, and
				// returns only once it has.
				close(release)
				select {
				case <-queuedLate:
				case <-time.After(10 * time.Second):
					return errors.New("the abandoned call did not come back")
				}
			}
			return h.HandleBatch(ctx, b)
		}))
		cfg.ClaimFirst = claimFirst
		cfg.HandlerTimeout = 100 * time.Millisecond
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
		r.stop()
		require.GreaterOrEqual(t, calls.Load(), int32(2))
		e.requireExactlyOnce(ids)
	})
}
