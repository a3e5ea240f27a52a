package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
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
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/offsets"
	"github.com/kafkaonce/kafkaonce/outbox"
)

// letters returns the test consumer's dead letters by message id (or by
// "offset:<n>" for letters without an id).
func (e *env) letters() map[string]deadletter.Letter {
	e.t.Helper()
	s, err := deadletter.NewStore(e.db.Schema)
	require.NoError(e.t, err)
	ls, err := s.List(context.Background(), e.db.Pool, deadletter.Filter{Consumer: e.name, Limit: 10000})
	require.NoError(e.t, err)
	out := map[string]deadletter.Letter{}
	for _, l := range ls {
		k := l.MessageID
		if k == "" {
			k = "offset:" + strconv.FormatInt(l.Offset, 10)
		}
		out[k] = l
	}
	return out
}

func (e *env) claimStatus(id string) string {
	var s string
	require.NoError(e.t, e.db.Pool.QueryRow(context.Background(), `SELECT status FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1")+` AND message_id = $2`, e.name, id).Scan(&s))
	return s
}

func TestEveryFailureClassIsDeadLetteredAndThePartitionMovesOn(t *testing.T) {
	t.Parallel()
	type poison struct {
		id    string
		class deadletter.Class
		want  string // in the letter's error text
	}
	cases := []poison{
		{"permanent", deadletter.ClassPermanent, "partner rejected the transfer"},
		{"panic", deadletter.ClassPanic, "index out of range"},
		{"undecodable", deadletter.ClassUndecodable, "cannot unmarshal number"},
		{"bad-bytes", deadletter.ClassData, "22021"},
		{"too-long", deadletter.ClassData, "54000"},
		{"commits", deadletter.ClassTxMisuse, "committed or rolled back for the handler, not by it"},
		{"flaky", deadletter.ClassRetriesExhausted, "partner timeout"},
		{"swallows", deadletter.ClassRetriesExhausted, "transaction is aborted"},
	}
	e := setup(t, len(cases)+2)
	var msgs []kafka.Message
	for p, c := range cases {
		msgs = append(msgs, msg(p, c.id+"-before", `{}`), msg(p, c.id, `{"n":1}`), msg(p, c.id+"-after", `{}`))
	}
	// Partition 6: a message with no id. Partition 7: an id reused for
	// different content.
	invalidPart, conflictPart := len(cases), len(cases)+1
	msgs = append(msgs, msg(invalidPart, "noid-before", `{}`),
		kafka.Message{Partition: invalidPart, Key: []byte("k"), Value: []byte("no id here"), Headers: []kafka.Header{{Key: "trace", Value: []byte("t-1")}}},
		msg(invalidPart, "noid-after", `{}`))
	msgs = append(msgs, msg(conflictPart, "dup", `{"amount":10}`), msg(conflictPart, "dup", `{"amount":99}`), msg(conflictPart, "dup-after", `{}`))
	e.kafka.Produce(t, e.topic, msgs...)

	var flakyCalls atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := e.applyHandler().Handle(ctx, tx, m); err != nil {
			return err
		}
		switch m.ID {
		case "permanent":
			return consumer.Permanent(errors.New("partner rejected the transfer"))
		case "panic":
			var a []int
			_ = a[3]
		case "undecodable":
			var v struct{ N string }
			return json.Unmarshal(m.Value, &v) // a number where a string belongs
		case "bad-bytes":
			_, err := tx.Exec(ctx, `SELECT convert_from('\xff'::bytea, 'UTF8')`)
			return err
		case "too-long":
			_, err := tx.Exec(ctx, `SELECT repeat('x', 1 << 30)`)
			return err
		case "commits":
			return tx.Commit(ctx)
		case "flaky":
			flakyCalls.Add(1)
			return errors.New("partner timeout")
		case "swallows":
			_, _ = tx.Exec(ctx, `SELECT 1/0`) // error ignored
		}
		return nil
	})
	cfg := e.config(h)
	cfg.Retry.MaxAttempts = 3
	cfg.Retry.InitialInterval = time.Millisecond
	cfg.Retry.MaxInterval = 5 * time.Millisecond
	r := e.start(cfg)
	committed := map[int]int64{}
	for p := range cases {
		committed[p] = 3
	}
	committed[invalidPart], committed[conflictPart] = 3, 3
	e.waitCommitted(committed, 60*time.Second)
	r.stop()

	var good []string
	for _, c := range cases {
		good = append(good, c.id+"-before", c.id+"-after")
	}
	good = append(good, "noid-before", "noid-after", "dup", "dup-after")
	e.requireExactlyOnce(good)
	require.Equal(t, `{"amount":10}`, e.effectValue("dup"))

	letters := e.letters()
	require.Len(t, letters, len(cases)+2)
	for p, c := range cases {
		l := letters[c.id]
		require.Equal(t, c.class, l.Class, c.id)
		require.Contains(t, l.Error, c.want, c.id)
		require.Equal(t, e.topic, l.Topic)
		require.Equal(t, p, l.Partition, c.id)
		require.EqualValues(t, 1, l.Offset, c.id)
		require.Equal(t, `{"n":1}`, string(l.Value), c.id)
		require.Equal(t, c.id, string(l.Key), c.id)
		require.Equal(t, []deadletter.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte(c.id)}}, l.Headers, c.id)
		require.False(t, l.FirstFailedAt.IsZero(), c.id)
		require.False(t, l.LastFailedAt.Before(l.FirstFailedAt), c.id)
		require.Equal(t, "dead_lettered", e.claimStatus(c.id), c.id)
		if c.class == deadletter.ClassRetriesExhausted {
			require.Equal(t, 3, l.Attempts, c.id)
		} else {
			require.Equal(t, 1, l.Attempts, "%s: permanent failures are not retried", c.id)
		}
	}
	require.EqualValues(t, 3, flakyCalls.Load(), "MaxAttempts handler calls, no more")

	invalid := letters["offset:1"]
	require.Equal(t, deadletter.ClassInvalidID, invalid.Class)
	require.Equal(t, invalidPart, invalid.Partition)
	require.Empty(t, invalid.MessageID)
	require.Equal(t, "no id here", string(invalid.Value))
	require.Equal(t, []deadletter.Header{{Key: "trace", Value: []byte("t-1")}}, invalid.Headers)
	require.Contains(t, invalid.Error, `no "message-id" header`)

	conflict := letters["dup"]
	require.Equal(t, deadletter.ClassConflict, conflict.Class)
	require.EqualValues(t, 1, conflict.Offset)
	require.Equal(t, `{"amount":99}`, string(conflict.Value))
	require.Len(t, e.events.snapshot().conflicts, 1, "the conflict was reported to the hook")

	require.Empty(t, e.events.snapshot().stopped, "no partition stopped")
	positions := e.storedPositions()
	for p := 0; p < e.parts; p++ {
		require.EqualValues(t, 3, positions[p])
	}
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("message_attempts")), "attempt rows are cleared with the message")
}

// The documented procedure after a topic is deleted and re-created:
// topic-recreated. The new topic's messages then come at the offsets
// of the old one's, and a new poison message at the offset of an old letter
// must be set aside in a letter of its own. Were it taken for the old
// letter, the position would move past it: neither applied nor set aside.
func TestAPoisonMessageOfARecreatedTopicIsSetAsideAtTheOffsetOfAnOldLetter(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "old-poison" || m.ID == "new-poison" {
			return consumer.Permanent(errors.New("rejected"))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	e.kafka.Produce(t, e.topic, msg(0, "old-0", "a"), msg(0, "old-poison", "old poison"), msg(0, "old-2", "c"))
	r := e.start(e.config(h))
	e.waitEffects(2, 30*time.Second)
	r.stop()
	require.Contains(t, e.letters(), "old-poison")

	ctx := context.Background()
	e.recreateTopic()
	positions, err := offsets.NewStore(e.db.Schema)
	require.NoError(t, err)
	_, err = positions.TopicRecreated(ctx, e.db.Pool, e.name, e.topic, 1)
	require.NoError(t, err)
	e.kafka.Produce(t, e.topic, msg(0, "new-0", "d"), msg(0, "new-poison", "new poison"), msg(0, "new-2", "f"))

	r = e.start(e.config(h))
	e.waitEffects(4, 30*time.Second) // new-2 comes after the poison: it was dealt with
	r.stop()

	e.requireExactlyOnce([]string{"old-0", "old-2", "new-0", "new-2"})
	letters := e.letters()
	require.Len(t, letters, 2)
	for id, value := range map[string]string{"old-poison": "old poison", "new-poison": "new poison"} {
		l, ok := letters[id]
		require.True(t, ok, "the letter of %s", id)
		require.EqualValues(t, 1, l.Offset, id)
		require.Equal(t, value, string(l.Value), id)
	}
	require.Equal(t, "dead_lettered", e.claimStatus("new-poison"))
	require.EqualValues(t, 3, e.storedPositions()[0])
}

// An error marked by outbox.Permanent is as permanent to the consumer as one
// marked by consumer.Permanent: the message is dead-lettered after one call,
// with class permanent, and the partition moves on.
func TestOutboxPermanentIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.kafka.Produce(t, e.topic, msg(0, "before", `{}`), msg(0, "rejected", `{}`), msg(0, "after", `{}`))
	var calls atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "rejected" {
			calls.Add(1)
			return fmt.Errorf("notify partner: %w", outbox.Permanent(errors.New("partner rejected the transfer")))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.Retry.MaxAttempts = 5
	cfg.Retry.InitialInterval = time.Millisecond
	cfg.Retry.MaxInterval = 5 * time.Millisecond
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 60*time.Second)
	r.stop()

	e.requireExactlyOnce([]string{"before", "after"})
	letters := e.letters()
	require.Len(t, letters, 1)
	l := letters["rejected"]
	require.Equal(t, deadletter.ClassPermanent, l.Class)
	require.Equal(t, 1, l.Attempts, "a permanent failure is not retried")
	require.Contains(t, l.Error, "partner rejected the transfer")
	require.EqualValues(t, 1, calls.Load(), "one handler call")
	require.Empty(t, e.events.snapshot().stopped, "no partition stopped")
	e.check(expectation{ids: []string{"before", "rejected", "after"}, poison: []string{"rejected"}})
}

func TestBackoffWaitEndsOnShutdown(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("a", 3)
	var calls atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "a-1" {
			calls.Add(1)
			return errors.New("still down")
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.Retry.InitialInterval = time.Hour // the first retry waits up to an hour
	cfg.Retry.MaxInterval = time.Hour
	r := e.start(cfg)
	e.waitEffects(1, 30*time.Second)
	waitFor(t, 10*time.Second, "the first failure", func() bool { return calls.Load() == 1 })
	time.Sleep(200 * time.Millisecond)
	began := time.Now()
	r.stop()
	require.Less(t, time.Since(began), 5*time.Second, "a backoff wait must end at shutdown")
	e.requireExactlyOnce([]string{"a-0"})
	require.Empty(t, e.letters(), "an interrupted retry sets nothing aside")
	require.EqualValues(t, 1, calls.Load())
}

func TestAttemptsSurviveARestart(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("s", 3)
	var calls atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "s-1" {
			calls.Add(1)
			return fmt.Errorf("down (call %d)", calls.Load())
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.Retry.MaxAttempts = 5
	cfg.Retry.InitialInterval = time.Millisecond
	cfg.Retry.MaxInterval = 20 * time.Millisecond
	gate := newFailGate(3)
	cfg.Hooks = append(cfg.Hooks, gate)
	r := e.start(cfg)
	<-gate.reached // the third attempt failed
	r.stop()
	require.EqualValues(t, 3, calls.Load())
	require.Empty(t, e.letters())

	// A new process picks up the count where the old one left it.
	cfg.Hooks = []consumer.Hook{e.events}
	r = e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	r.stop()
	require.EqualValues(t, 5, calls.Load(), "MaxAttempts in total across both processes")
	l := e.letters()["s-1"]
	require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
	require.Equal(t, 5, l.Attempts)
	require.Contains(t, l.Error, "down (call 5)")
	e.requireExactlyOnce([]string{"s-0", "s-2"})
}

// failGate signals once a message's failed attempts reach stopAt, and holds
// the worker there until the test has stopped the consumer.
type failGate struct {
	stopAt  int
	reached chan struct{}
	once    atomic.Bool
}

func newFailGate(stopAt int) *failGate {
	return &failGate{stopAt: stopAt, reached: make(chan struct{})}
}

func (g *failGate) OnMessageFailed(ctx context.Context, _ *consumer.Message, f consumer.Failure) {
	if f.Attempt >= g.stopAt && g.once.CompareAndSwap(false, true) {
		close(g.reached)
		<-ctx.Done() // no further attempt in this process
	}
}

func TestInfrastructureFailuresDoNotCountAsAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("i", 5)
	var failures atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "i-2" {
			switch failures.Add(1) {
			case 1:
				// A real serialization failure would come from a concurrent
				// SERIALIZABLE transaction; pgx reports it as this error.
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END $$`)
				return err
			case 2:
				_, err := tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$`)
				return err
			case 3:
				// The connection dies under the handler.
				_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
				return err
			}
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.Retry.MaxAttempts = 1 // any counted failure would dead-letter i-2
	r := e.start(cfg)
	e.waitEffects(len(ids), 30*time.Second)
	r.stop()
	e.requireExactlyOnce(ids)
	require.Empty(t, e.letters())
	require.EqualValues(t, 4, failures.Load())
	e.check(expectation{ids: ids})
}

func TestPoisonFloodKeepsThePartitionMoving(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	const total = 1000
	var msgs []kafka.Message
	var good, all, bad []string
	for i := range total {
		id := "p-" + strconv.Itoa(i)
		msgs = append(msgs, msg(i%2, id, "v"))
		all = append(all, id)
		if i%10 != 7 {
			good = append(good, id)
		} else {
			bad = append(bad, id)
		}
	}
	e.kafka.Produce(t, e.topic, msgs...)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n, _ := strconv.Atoi(m.ID[2:])
		if n%10 == 7 {
			return consumer.Permanent(fmt.Errorf("poison %d", n))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	e.waitCommitted(map[int]int64{0: total / 2, 1: total / 2}, 60*time.Second)
	r.stop()

	e.requireExactlyOnce(good)
	letters := e.letters()
	require.Len(t, letters, total/10)
	var ids []string
	for id, l := range letters {
		require.Equal(t, deadletter.ClassPermanent, l.Class)
		ids = append(ids, id)
	}
	sort.Strings(ids)
	require.Equal(t, "p-107", ids[0])
	e.check(expectation{ids: all, poison: bad})
}

func TestHungHandlerIsCutOff(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("h", 4)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // let the abandoned goroutines end before the leak check
	var calls atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := e.applyHandler().Handle(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "h-1" {
			switch calls.Add(1) {
			case 1:
				<-ctx.Done() // a handler that at least notices its context
				return ctx.Err()
			case 2:
				// Stuck in a statement; pgx gives up on it when ctx ends,
				// and the server must stop running it too.
				_, err := tx.Exec(ctx, `SELECT pg_sleep(3600) /* hung handler */`)
				return err
			default:
				<-release // one that ignores its context entirely
			}
		}
		return nil
	})
	cfg := e.config(h)
	cfg.HandlerTimeout = 300 * time.Millisecond
	cfg.Retry.MaxAttempts = 3
	cfg.Retry.InitialInterval = time.Millisecond
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	r.stop()

	e.requireExactlyOnce([]string{ids[0], ids[2], ids[3]})
	l := e.letters()["h-1"]
	require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
	require.Contains(t, l.Error, "HandlerTimeout")
	require.Contains(t, l.Error, "abandoned")
	require.Equal(t, 3, l.Attempts)
	require.EqualValues(t, 3, calls.Load())
	waitFor(t, 10*time.Second, "the server to end the hung handlers' sessions", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%hung handler%' AND pid <> pg_backend_pid()`) == 0 &&
			e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%' AND query LIKE '%effects%'`) == 0
	})
	e.check(expectation{ids: ids, poison: []string{"h-1"}}) // the hung handler holds no connection
}

func TestMessageThatKillsTheProcessIsSetAsideAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("c", 10)
	const poison = "c-4"
	spec := childSpec{DatabaseURL: e.db.URL, Schema: e.db.Schema, Brokers: e.kafka.Brokers, Topic: e.topic, Name: e.name,
		KillOn: poison, MaxAttempts: 3}

	// Restart the worker each time it dies, as a supervisor would. A new
	// group each time spares the wait for the dead member's session to
	// expire; the stored position and the attempt counts live in Postgres.
	kills := 0
	for run := 0; run < 10 && len(e.letters()) == 0; run++ {
		spec.Group = fmt.Sprintf("%s_%d", e.group, run)
		killed, out := e.runChild(spec, 30*time.Second, func() bool { return len(e.letters()) > 0 })
		if !killed {
			require.NotEmpty(t, e.letters(), "the child ended without being killed and without setting the poison aside:\n%s", out)
			break
		}
		kills++
		// Order is kept meanwhile: nothing after the poison is applied
		// while it is unresolved.
		require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE kafka_offset > 4`))
	}
	// The run that set the poison aside goes on with the rest.
	r := e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: 10}, 30*time.Second)
	r.stop()

	e.requireExactlyOnce(append(append([]string{}, ids[:4]...), ids[5:]...))
	l := e.letters()[poison]
	require.Equal(t, deadletter.ClassCrashed, l.Class)
	require.Equal(t, 3, l.Attempts)
	require.Contains(t, l.Error, "ended without a result")
	// One kill in the first batch (no attempt counted there), then one per
	// counted attempt.
	require.Equal(t, 4, kills)
	e.check(expectation{ids: ids, poison: []string{poison}})
}

func TestTransientFailureBehindAPoisonInTheSameBatch(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	// The poison sends the batch into savepoint mode; the flaky message
	// behind it then cuts that transaction short.
	e.kafka.Produce(t, e.topic, msg(0, "a", "1"), msg(0, "poison", "2"), msg(0, "b", "3"), msg(0, "flaky", "4"), msg(0, "c", "5"))
	var flaked atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "poison":
			return consumer.Permanent(errors.New("bad"))
		case m.ID == "flaky" && !flaked.Swap(true):
			return errors.New("once")
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.Retry.InitialInterval = time.Millisecond
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	r.stop()
	e.requireExactlyOnce([]string{"a", "b", "flaky", "c"})
	require.Equal(t, deadletter.ClassPermanent, e.letters()["poison"].Class)
}

// batchSizes records the size of every batch transaction.
type batchSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (b *batchSizes) OnBatchStart(_ context.Context, info consumer.BatchInfo) {
	b.mu.Lock()
	b.sizes = append(b.sizes, info.Size)
	b.mu.Unlock()
}

func TestACleanStopWithoutProgressDoesNotLookLikeACrash(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("n", 10)
	entered := make(chan struct{})
	var once sync.Once
	hang := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		once.Do(func() { close(entered) })
		<-ctx.Done() // never finishes: the run makes no progress
		return ctx.Err()
	})
	cfg := e.config(hang)
	cfg.ShutdownTimeout = 200 * time.Millisecond
	r := e.start(cfg)
	<-entered
	r.stop()

	sizes := &batchSizes{}
	cfg = e.config(e.applyHandler())
	cfg.Hooks = append(cfg.Hooks, sizes)
	r = e.start(cfg)
	e.waitCommitted(map[int]int64{0: 10}, 30*time.Second)
	r.stop()
	e.requireExactlyOnce(ids)
	sizes.mu.Lock()
	defer sizes.mu.Unlock()
	require.Equal(t, 10, sizes.sizes[0], "the next run batches as usual, instead of going one message at a time")
}

// The documented procedure for a topic deleted and re-created, end to
// end, for a consumer whose ids are positions: the new topic's messages
// repeat the old ones' positions, and offsets.Store.TopicRecreated retires
// the old claims and letters so that they are applied (and a poison one
// set aside) as messages of their own, never taken for conflicting copies
// of the old ones. The old records stay, renamed; a consumer with
// producer ids keeps its claims as they were.
func TestATopicRecreatedByTheProcedureIsAppliedAfresh(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		position bool // IDFromPosition; else the producer's header ids
	}{
		{name: "position ids", position: true},
		{name: "producer ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if strings.HasSuffix(string(m.Value), "poison") {
					return consumer.Permanent(errors.New("rejected"))
				}
				_, err := tx.Exec(ctx, `INSERT INTO `+e.db.Table("effects")+` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`,
					m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
				return err
			})
			cfg := func() *consumer.Config {
				c := e.config(h)
				if tc.position {
					c.MessageID = consumer.IDFromPosition()
				}
				return c
			}
			e.kafka.Produce(t, e.topic, msg(0, "old-0", "a"), msg(0, "old-1", "old poison"), msg(0, "old-2", "c"))
			r := e.start(cfg())
			e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
			r.stop()

			ctx := context.Background()
			e.recreateTopic()
			positions, err := offsets.NewStore(e.db.Schema)
			require.NoError(t, err)
			res, err := positions.TopicRecreated(ctx, e.db.Pool, e.name, e.topic, 1)
			require.NoError(t, err)
			require.EqualValues(t, 1, res.Positions)
			retired := int64(0)
			if tc.position {
				retired = 3
			}
			require.Equal(t, retired, res.RetiredClaims, "the old claims retired")
			require.Equal(t, retired/3, res.RetiredLetters, "the old letter retired")

			// The new messages: the same offsets, other contents, and (with
			// producer ids) other ids.
			e.kafka.Produce(t, e.topic, msg(0, "new-0", "d"), msg(0, "new-1", "new poison"), msg(0, "new-2", "f"))
			r = e.start(cfg())
			e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
			r.stop()
			require.Empty(t, e.events.snapshot().stopped)

			values := map[string]int{}
			rows, err := e.db.Pool.Query(ctx, `SELECT value FROM `+e.db.Table("effects"))
			require.NoError(t, err)
			for rows.Next() {
				var v string
				require.NoError(t, rows.Scan(&v))
				values[v]++
			}
			require.NoError(t, rows.Err())
			require.Equal(t, map[string]int{"a": 1, "c": 1, "d": 1, "f": 1}, values, "each message of either topic applied once")
			var classes []string
			for _, l := range e.letters() {
				classes = append(classes, string(l.Value)+": "+string(l.Class))
			}
			sort.Strings(classes)
			require.Equal(t, []string{"new poison: permanent", "old poison: permanent"}, classes, "each topic's poison set aside as itself, no conflict")
			if tc.position {
				newID := e.topic + "/0/1"
				require.Equal(t, "dead_lettered", e.claimStatus(newID))
				require.Equal(t, "dead_lettered", e.claimStatus(newID+res.Suffix), "the old claim kept, renamed")
			}
		})
	}
}

// recreateTopic deletes the test's one-partition topic and creates it
// again, waiting until the new, empty topic answers.
func (e *env) recreateTopic() {
	e.t.Helper()
	ctx := context.Background()
	require.NoError(e.t, devenv.DeleteTopic(ctx, e.kafka.Brokers, e.topic))
	admin := testenv.Admin(e.t, e.kafka.Brokers)
	waitFor(e.t, 30*time.Second, "the topic to be re-created, empty", func() bool {
		if devenv.CreateTopic(ctx, e.kafka.Brokers, e.topic, 1) != nil {
			return false
		}
		bounds, err := admin.LogBounds(ctx, e.topic, []int{0})
		return err == nil && bounds[0].End == 0
	})
}
