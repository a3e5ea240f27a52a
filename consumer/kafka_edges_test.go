package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// appliedOf returns which of the ids prefix-0 .. prefix-(n-1) have an
// effect.
func (e *env) appliedOf(prefix string, n int) []bool {
	e.t.Helper()
	out := make([]bool, n)
	for i := range n {
		out[i] = e.db.Int(e.t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id = $1`, fmt.Sprintf("%s-%d", prefix, i)) > 0
	}
	return out
}

// topicID returns the test topic's id.
func (e *env) topicID() [16]byte {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	td, err := kadm.NewClient(e.kafka.Client(e.t)).ListTopics(ctx, e.topic)
	require.NoError(e.t, err)
	return td[e.topic].ID
}

// failNextFetch makes the in-process broker answer the next Fetch request
// with code as the error of partition 0 of the test's topic (and nothing
// else), and closes the returned channel once it did.
func (e *env) failNextFetch(code int16) <-chan struct{} {
	e.t.Helper()
	id := e.topicID()
	fired := make(chan struct{})
	e.kafka.Fake.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		resp.SessionID = req.SessionID
		rt := kmsg.NewFetchResponseTopic()
		rt.Topic, rt.TopicID = e.topic, id
		rp := kmsg.NewFetchResponseTopicPartition()
		rp.Partition, rp.ErrorCode, rp.HighWatermark, rp.LastStableOffset, rp.LogStartOffset = 0, code, -1, -1, -1
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		close(fired)
		return resp, nil, true
	})
	return fired
}

// watchLog returns l, and a channel closed once l logs msg.
func watchLog(l *slog.Logger, msg string) (*slog.Logger, <-chan struct{}) {
	h := &logWatch{Handler: l.Handler(), msg: msg, seen: make(chan struct{}), once: &sync.Once{}}
	return slog.New(h), h.seen
}

type logWatch struct {
	slog.Handler
	msg  string
	seen chan struct{}
	once *sync.Once
}

func (h *logWatch) Enabled(context.Context, slog.Level) bool { return true }

func (h *logWatch) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.seen) })
	}
	if h.Handler.Enabled(ctx, r.Level) {
		return h.Handler.Handle(ctx, r)
	}
	return nil
}

func (h *logWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return &logWatch{Handler: h.Handler.WithAttrs(as), msg: h.msg, seen: h.seen, once: h.once}
}

func (h *logWatch) WithGroup(name string) slog.Handler {
	return &logWatch{Handler: h.Handler.WithGroup(name), msg: h.msg, seen: h.seen, once: h.once}
}

// failBoundsOf makes the in-process broker refuse, for d from now, every
// ListOffsets request that asks for partition alone of the test's topic (a
// worker's read of its partition's bounds at assignment, which it retries);
// requests for several partitions (a topic's bounds) go through.
func (e *env) failBoundsOf(partition int32, d time.Duration) {
	until := time.Now().Add(d)
	e.kafka.Fake.ControlKey(kmsg.ListOffsets.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if time.Now().Before(until) {
			e.kafka.Fake.KeepControl()
		}
		req := kreq.(*kmsg.ListOffsetsRequest)
		if time.Now().After(until) || len(req.Topics) != 1 || req.Topics[0].Topic != e.topic || len(req.Topics[0].Partitions) != 1 || req.Topics[0].Partitions[0].Partition != partition {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		rt := kmsg.NewListOffsetsResponseTopic()
		rt.Topic = e.topic
		rp := kmsg.NewListOffsetsResponseTopicPartition()
		rp.Partition, rp.ErrorCode = partition, -1 // UNKNOWN_SERVER_ERROR
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
}

// A topic deleted and re-created under a running consumer, and grown past
// the old position before the consumer looks again: nothing in the offsets
// tells the new log from the old, but franz-go's fetch of the old topic id
// fails (UNKNOWN_TOPIC_ID) before any reopen, and the partition stops with
// ErrTopicRecreated instead of applying new-20 onwards and passing over
// new-0 to new-19. kafka-go finds the new id at its next look at the
// log's bounds (an idle check, or the assignment after a rebalance).
func TestATopicRecreatedAndGrownPastThePositionWhileRunningStops(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	old := e.produceIDs("old", 20)
	cfg := e.config(e.applyHandler())
	cfg.MetadataMaxAge = time.Second
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, devenv.DeleteTopic(ctx, e.kafka.Brokers, e.topic))
	// Let the consumer see the topic gone for a while, as it would while
	// an operator takes a few seconds between the delete and the create.
	time.Sleep(3 * time.Second)
	require.NoError(t, devenv.CreateTopic(ctx, e.kafka.Brokers, e.topic, 1))
	e.produceIDs("new", 40)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if e.events.stoppedWith(consumer.ErrTopicRecreated) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.stop()
	applied := e.appliedOf("new", 40)
	var skipped, done []string
	for i, a := range applied {
		if a {
			done = append(done, fmt.Sprint(i))
		} else {
			skipped = append(skipped, fmt.Sprint(i))
		}
	}
	if len(done) > 0 && len(skipped) > 0 {
		t.Fatalf("the re-created topic's messages %s were applied and %s skipped without a word (stopped: %v)",
			strings.Join(done, ","), strings.Join(skipped, ","), e.events.snapshot().stopped)
	}
	require.True(t, e.events.stoppedWith(consumer.ErrTopicRecreated), "the partition did not stop with ErrTopicRecreated; applied: %v", done)
	e.requireExactlyOnce(old)
}

// A partition reported held whose fetcher is closed and opened again (a
// fetch that failed with an error that is no verdict on the log) hears the
// end of the wait: the old fetcher reports its wait over as it closes, and
// the new one reports it again only if it still holds. Before, the
// transaction committing within OpenTransactionAfter of the reopen left
// HookPartitionHeld without Released and partition_runs.held_at set: status
// showed the partition HELD while it flowed.
func TestAHeldPartitionIsReleasedWhenItsFetcherIsReopened(t *testing.T) {
	t.Parallel()
	if kafkaClient() == consumer.KafkaGo {
		t.Skip("kafka-go reports no open transaction")
	}
	// A broker of the test's own: every fetch it answers is this
	// consumer's.
	dk, err := devenv.StartFakeKafka()
	require.NoError(t, err)
	t.Cleanup(func() { _ = dk.Close() })
	e := setupOn(t, 1, &testenv.Kafka{Kafka: dk})
	before := e.plain("p-0", "p-1")
	w := e.txnWriter("tx")
	w.begin()
	open := w.write("o-0", "o-1", "o-2")
	cfg := e.txnConfig(idRules[0], false)
	held := &heldWatch{}
	cfg.Hooks = append(cfg.Hooks, held)
	var reopened <-chan struct{}
	cfg.Logger, reopened = watchLog(cfg.Logger, "fetch failed; reopening the partition")
	r := e.start(cfg)
	heldAt := func() int64 {
		return e.db.Int(t, `SELECT coalesce(max(held_at), -1) FROM `+e.db.Table("partition_runs")+` WHERE consumer = $1`, e.name)
	}
	waitFor(t, 30*time.Second, "the open transaction reported", func() bool { return len(held.snapshot()) > 0 })
	waitFor(t, 10*time.Second, "the wait recorded for operators", func() bool { return heldAt() == open[0].Offset })

	fired := e.failNextFetch(-1) // UNKNOWN_SERVER_ERROR
	select {
	case <-fired:
	case <-time.After(30 * time.Second):
		t.Fatal("no fetch was failed")
	}
	select {
	case <-reopened:
	case <-time.After(30 * time.Second):
		t.Fatal("the partition was not reopened")
	}
	// Within OpenTransactionAfter of the reopen: the new Fetcher has not
	// reported the wait yet.
	time.Sleep(50 * time.Millisecond)
	w.end(true)
	after := e.plain("q-0")
	e.waitEffects(len(before)+len(open)+len(after), 30*time.Second)
	// The partition is processing again: nothing holds it back.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		rs := held.snapshot()
		if rs[len(rs)-1].Released && heldAt() == -1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	rs := held.snapshot()
	last := rs[len(rs)-1]
	at := heldAt()
	r.stop()
	require.Truef(t, last.Released, "the partition flows again but the last HookPartitionHeld report says it is held at %d (reports: %+v)", last.Offset, rs)
	require.EqualValues(t, -1, at, "partition_runs.held_at still set while the partition flows: status shows it HELD")
	e.check(expectation{ids: e.ids(idRules[0], before, open, after)})
}

// Under StartLatest, the first start of a topic stores the first starts of
// all its partitions, but not over a group offset: a partition with one
// starts there. The group has offset 5 on partition 0 (messages 5 to 9
// never processed) and none on partition 1; partition 0's worker is slow to
// read its bounds (the broker refuses them for three seconds) while
// partition 1's resolves StartLatest for the topic. Storing partition 0's
// log end then would have made its worker start at 10, messages 5 to 9
// passed over as a rewind.
func TestStartLatestLeavesASiblingsGroupOffsetToIt(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	if e.kafka.Fake == nil {
		t.Skip("needs the in-process broker to slow a request")
	}
	var p0 []string
	var msgs []kafka.Message
	for i := range 10 {
		id := fmt.Sprintf("a-%d", i)
		p0 = append(p0, id)
		msgs = append(msgs, msg(0, id, "v"), msg(1, fmt.Sprintf("b-%d", i), "v"))
	}
	e.kafka.Produce(t, e.topic, msgs...)
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 5})
	e.failBoundsOf(0, 3*time.Second)

	cfg := e.config(e.applyHandler())
	cfg.StartOffset = consumer.StartLatest
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "both partitions started", func() bool {
		return len(e.events.snapshot().assigned) >= 2
	})
	after := e.produceTo("after", 2, 0, 1)
	// Each partition in offset order: once the messages written after the
	// start are applied, whatever came before them that is to be applied
	// is too.
	waitFor(t, 30*time.Second, "the messages written after the start applied", func() bool {
		for _, id := range after {
			if e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id = $1`, id) == 0 {
				return false
			}
		}
		return true
	})
	r.stop()
	var starts []string
	for _, a := range e.events.snapshot().assigned {
		starts = append(starts, fmt.Sprintf("p%d: kafka offset %d, start %d", a.Partition, a.KafkaOffset, a.Start))
	}
	t.Logf("assignments: %v", starts)
	applied := e.appliedOf("a", 10)
	for i := 5; i < 10; i++ {
		require.Truef(t, applied[i], "message a-%d of partition 0, after the group offset 5, was never applied (assignments: %v)", i, starts)
	}
}

// Run is cancelled while the broker is down: the revocation waits for the
// workers and tries their last offset commits (bounded), the member leaves,
// the clients close, and Run returns within about ShutdownTimeout.
func TestRunReturnsWhenCancelledWhileTheBrokerIsDown(t *testing.T) {
	t.Parallel()
	dk, err := devenv.StartFakeKafka(kfake.SeedTopics(2, "down-topic"))
	require.NoError(t, err)
	k := &testenv.Kafka{Kafka: dk}
	e := setupOn(t, 2, k)
	e.topic = "down-topic"
	e.produceIDs("d", 200)
	cfg := e.config(e.applyHandler())
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.waitEffects(200, 30*time.Second)
	dk.Close()
	time.Sleep(time.Second)
	began := time.Now()
	cancel()
	select {
	case err := <-done:
		t.Logf("Run returned %v after %v", err, time.Since(began))
		require.NoError(t, err)
		require.Less(t, time.Since(began), cfg.ShutdownTimeout+15*time.Second, "Run took too long to return after cancel")
	case <-time.After(60 * time.Second):
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("Run did not return within 60s of cancel while the broker is down; goroutines:\n%s", buf)
	}
}

// Two transactional producers interleave their records in one partition,
// one aborting and the other committing, with records outside any
// transaction between them, while the consumer runs.
func TestInterleavedTransactionsOfTwoProducers(t *testing.T) {
	t.Parallel()
	if kafkaClient() == consumer.KafkaGo {
		t.Skip("kafka-go refuses transactional topics")
	}
	for _, rule := range idRules[:2] {
		t.Run(rule.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			x, y := e.txnWriter("x"), e.txnWriter("y")
			var want [][]*kgo.Record
			want = append(want, e.plain("p-0"))
			cfg := e.txnConfig(rule, false)
			r := e.start(cfg)
			e.waitEffects(1, 30*time.Second)
			for round := range 5 {
				x.begin()
				y.begin()
				x.write(fmt.Sprintf("x-%d-0", round))
				ys := y.write(fmt.Sprintf("y-%d-0", round))
				want = append(want, e.plain(fmt.Sprintf("q-%d", round)))
				x.write(fmt.Sprintf("x-%d-1", round))
				ys = append(ys, y.write(fmt.Sprintf("y-%d-1", round))...)
				if round%2 == 0 {
					y.end(true)
					x.end(false)
				} else {
					x.end(false)
					y.end(true)
				}
				want = append(want, ys)
			}
			want = append(want, e.plain("p-1"))
			ids := e.ids(rule, want...)
			e.waitEffects(len(ids), 30*time.Second)
			r.stop()
			e.check(expectation{ids: ids})
		})
	}
}

// A partition far behind an open transaction is not reported held by it
// while it waits for its next fetch: 900 committed records, then a
// transaction left open; fetches of 30 records for batches of 10 pause and
// resume the partition's feed, and it waits for the next fetch between
// them. Only a partition that reached the transaction's first record
// waits on it.
func TestAPartitionBehindAnOpenTransactionIsNotReportedHeld(t *testing.T) {
	t.Parallel()
	if kafkaClient() == consumer.KafkaGo {
		t.Skip("kafka-go refuses transactional topics")
	}
	e := setup(t, 2)
	for b := range 30 {
		var msgs []kafka.Message
		for i := range 30 {
			id := fmt.Sprintf("c-%d-%d", b, i)
			msgs = append(msgs, msg(0, id, strings.Repeat("v", 100)))
		}
		e.kafka.Produce(t, e.topic, msgs...)
	}
	w := e.txnWriter("tx")
	w.begin()
	open := w.write("o-0")
	require.EqualValues(t, 900, open[0].Offset)
	cfg := e.config(e.applyHandler())
	cfg.MaxBatch = 10
	cfg.FetchMaxBytes = 1024
	// As the suite's own transaction tests set it.
	cfg.OpenTransactionAfter = 300 * time.Millisecond
	held := &heldWatch{}
	cfg.Hooks = append(cfg.Hooks, held)
	r := e.start(cfg)
	e.waitEffects(900, 60*time.Second)
	r.stop()
	var early []consumer.PartitionHeld
	for _, h := range held.snapshot() {
		if !h.Released {
			early = append(early, h)
		}
	}
	// A true wait at 900 is reported once, at the end; every other report
	// was made on the way there.
	require.LessOrEqualf(t, len(early), 1, "the partition was reported held %d times on its way to the open transaction: %+v", len(early), early)
	w.end(false)
}
