package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// txnWriter writes records to one test's topic, in Kafka transactions of
// one transactional id, or outside any.
type txnWriter struct {
	e  *env
	cl *kgo.Client
}

// txnWriter returns a transactional producer for the test's topic, of a
// transactional id named after name and the test.
func (e *env) txnWriter(name string) *txnWriter {
	return e.txnWriterOf(testenv.Name(e.t, name))
}

// txnWriterOf returns a transactional producer of the transactional id
// txnID: a second one of the same id fences the first.
func (e *env) txnWriterOf(txnID string) *txnWriter {
	e.t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...), kgo.TransactionalID(txnID),
		kgo.DefaultProduceTopic(e.topic), kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionTimeout(time.Minute))
	require.NoError(e.t, err)
	e.t.Cleanup(cl.Close)
	return &txnWriter{e: e, cl: cl}
}

// txnRecord is a record with the test's id in its message-id header and in
// its JSON value.
func txnRecord(partition int, id string) *kgo.Record {
	v, _ := json.Marshal(map[string]string{"id": id})
	return &kgo.Record{Partition: int32(partition), Key: []byte(id), Value: v, Headers: []kgo.RecordHeader{{Key: consumer.DefaultMessageIDHeader, Value: []byte(id)}}}
}

// write produces ids to partition 0 inside the open transaction (and
// waits for the broker to acknowledge them: they are in the log), and
// returns the records with their offsets.
func (w *txnWriter) write(ids ...string) []*kgo.Record {
	w.e.t.Helper()
	recs := make([]*kgo.Record, len(ids))
	for i, id := range ids {
		recs[i] = txnRecord(0, id)
	}
	require.NoError(w.e.t, w.cl.ProduceSync(context.Background(), recs...).FirstErr())
	return recs
}

func (w *txnWriter) begin() { require.NoError(w.e.t, w.cl.BeginTransaction()) }

func (w *txnWriter) end(commit bool) {
	w.e.t.Helper()
	require.NoError(w.e.t, w.cl.EndTransaction(context.Background(), kgo.TransactionEndTry(commit)))
}

// endSettled ends the open transaction, and waits until its marker is in
// partition 0's log: Kafka answers EndTxn once the decision is recorded
// and writes the markers after, so the log's end read right after end
// may still be the marker's offset. It waits for the last stable offset
// to reach the log's end, so no other transaction may be open on the
// partition.
func (w *txnWriter) endSettled(commit bool) {
	w.e.t.Helper()
	w.end(commit)
	admin := kadm.NewClient(w.e.kafka.Client(w.e.t))
	waitFor(w.e.t, 30*time.Second, "the transaction's marker in the log", func() bool {
		ends, err := admin.ListEndOffsets(context.Background(), w.e.topic)
		if err != nil {
			return false
		}
		stable, err := admin.ListCommittedOffsets(context.Background(), w.e.topic)
		if err != nil {
			return false
		}
		e, ok1 := ends.Lookup(w.e.topic, 0)
		s, ok2 := stable.Lookup(w.e.topic, 0)
		return ok1 && ok2 && e.Err == nil && s.Err == nil && s.Offset == e.Offset
	})
}

// plain produces ids to partition 0 outside any transaction.
func (e *env) plain(ids ...string) []*kgo.Record {
	e.t.Helper()
	recs := make([]*kgo.Record, len(ids))
	for i, id := range ids {
		recs[i] = txnRecord(0, id)
		recs[i].Topic = e.topic
	}
	require.NoError(e.t, e.kafka.Client(e.t).ProduceSync(context.Background(), recs...).FirstErr())
	return recs
}

// idRule is one of the ways a test's messages get their ids: each names
// the id of a record as the consumer will derive it.
type idRule struct {
	name string
	rule consumer.MessageIDRule
	id   func(e *env, r *kgo.Record) string
}

var idRules = []idRule{
	{"IDFromHeader", consumer.IDFromHeader(consumer.DefaultMessageIDHeader), func(_ *env, r *kgo.Record) string { return string(r.Key) }},
	{"IDFromPosition", consumer.IDFromPosition(), func(e *env, r *kgo.Record) string {
		return e.topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
	}},
	{"IDFromJSONField", consumer.IDFromJSONField("id"), func(_ *env, r *kgo.Record) string { return string(r.Key) }},
}

// ids returns the ids the consumer derives for recs under rule.
func (e *env) ids(rule idRule, recs ...[]*kgo.Record) []string {
	var out []string
	for _, rs := range recs {
		for _, r := range rs {
			out = append(out, rule.id(e, r))
		}
	}
	return out
}

// eachIDRuleAndHandler runs test as parallel subtests for every id rule,
// with a Handler and with a BatchHandler.
func eachIDRuleAndHandler(t *testing.T, test func(t *testing.T, rule idRule, batch bool)) {
	for _, rule := range idRules {
		t.Run(rule.name, func(t *testing.T) {
			t.Parallel()
			bothWays(t, handlerKinds, func(t *testing.T, batch bool) { test(t, rule, batch) })
		})
	}
}

// txnConfig is the test's consumer with rule and a Handler or a
// BatchHandler, reporting an open transaction after 300ms.
func (e *env) txnConfig(rule idRule, batch bool) *consumer.Config {
	cfg := e.config(e.applyHandler())
	if batch {
		cfg = batchConfig(e, &batchEffects{e: e})
	}
	cfg.MessageID = rule.rule
	cfg.OpenTransactionAfter = 300 * time.Millisecond
	return cfg
}

// heldWatch records the HookPartitionHeld reports.
type heldWatch struct {
	mu      sync.Mutex
	reports []consumer.PartitionHeld
}

func (h *heldWatch) OnPartitionHeld(_ context.Context, p consumer.PartitionHeld) {
	h.mu.Lock()
	h.reports = append(h.reports, p)
	h.mu.Unlock()
}

func (h *heldWatch) snapshot() []consumer.PartitionHeld {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]consumer.PartitionHeld(nil), h.reports...)
}

// A topic written by transactional producers: only records of committed
// transactions, and records outside any, are applied, each once, and the
// partition's position and group offset reach the log's end, past the
// markers. The kafka-go client cannot tell, and stops the partition at the
// first marker instead (ErrTransactionalTopic).
func TestTransactionalTopics(t *testing.T) {
	t.Parallel()
	// finish checks what r, running, does with what the test wrote: the
	// ids applied are want, and nothing else; under kafka-go, the
	// partition stops with ErrTransactionalTopic.
	finish := func(e *env, r *running, want []string) {
		e.t.Helper()
		if kafkaClient() == consumer.KafkaGo {
			waitFor(e.t, 30*time.Second, "the partition stopped at a marker", func() bool { return e.events.stoppedWith(consumer.ErrTransactionalTopic) })
			r.stop()
			return
		}
		e.waitEffects(len(want), 30*time.Second)
		r.stop()
		e.check(expectation{ids: want})
	}
	run := func(e *env, cfg *consumer.Config, want []string) {
		e.t.Helper()
		finish(e, e.start(cfg), want)
	}

	t.Run("AbortedThenCommitted", func(t *testing.T) {
		eachIDRuleAndHandler(t, func(t *testing.T, rule idRule, batch bool) {
			e := setup(t, 1)
			w := e.txnWriter("tx")
			w.begin()
			w.write("a-0", "a-1", "a-2", "a-3", "a-4")
			w.end(false)
			w.begin()
			committed := w.write("c-0", "c-1", "c-2", "c-3", "c-4")
			w.end(true)
			run(e, e.txnConfig(rule, batch), e.ids(rule, committed))
		})
	})

	// Records of a transaction still open are not applied, the partition
	// waits (and says so), and what the transaction ends as decides.
	for _, commit := range []bool{false, true} {
		name := map[bool]string{false: "OpenThenAborted", true: "OpenThenCommitted"}[commit]
		t.Run(name, func(t *testing.T) {
			eachIDRuleAndHandler(t, func(t *testing.T, rule idRule, batch bool) {
				e := setup(t, 1)
				before := e.plain("p-0", "p-1")
				w := e.txnWriter("tx")
				w.begin()
				open := w.write("o-0", "o-1", "o-2")
				cfg := e.txnConfig(rule, batch)
				held := &heldWatch{}
				cfg.Hooks = append(cfg.Hooks, held)
				r := e.start(cfg)
				if kafkaClient() == consumer.KafkaGo {
					// kafka-go reads with read_committed too, and waits at the
					// open transaction (it reports nothing). Once the
					// transaction ends it hands out its records, aborted or
					// not, then the marker, which stops the partition.
					e.waitEffects(2, 30*time.Second)
					require.EqualValues(t, 2, e.distinctEffects(), "records of the open transaction were applied before it ended")
					w.end(commit)
					waitFor(t, 30*time.Second, "the partition stopped at the marker", func() bool { return e.events.stoppedWith(consumer.ErrTransactionalTopic) })
					r.stop()
					return
				}
				waitFor(t, 30*time.Second, "the open transaction reported", func() bool { return len(held.snapshot()) > 0 })
				require.EqualValues(t, 2, e.distinctEffects(), "records of the open transaction were applied before it ended")
				rep := held.snapshot()[0]
				require.Equal(t, consumer.PartitionHeld{Topic: e.topic, Partition: 0, Offset: open[0].Offset, LogEnd: open[2].Offset + 1, Since: rep.Since}, rep)
				heldAt := func() int64 {
					return e.db.Int(t, `SELECT coalesce(max(held_at), -1) FROM `+e.db.Table("partition_runs")+` WHERE consumer = $1`, e.name)
				}
				waitFor(t, 10*time.Second, "the wait recorded for operators", func() bool { return heldAt() == open[0].Offset })
				w.end(commit)
				after := e.plain("q-0")
				want := e.ids(rule, before, after)
				if commit {
					want = e.ids(rule, before, open, after)
				}
				e.waitEffects(len(want), 30*time.Second)
				waitFor(t, 10*time.Second, "the end of the wait reported", func() bool {
					rs := held.snapshot()
					return len(rs) == 2 && rs[1].Released && rs[1].Offset == open[0].Offset
				})
				waitFor(t, 10*time.Second, "the end of the wait recorded", func() bool { return heldAt() == -1 })
				r.stop()
				e.check(expectation{ids: want})
			})
		})
	}

	// A consumer first started under StartLatest while a transaction is
	// open starts at its first record, the last stable offset, not at the
	// log's end: the transaction's records come after the start once it
	// commits, as Kafka's own readers of committed records count them.
	t.Run("StartLatestAtAnOpenTransaction", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.plain("before-0", "before-1") // produced before the start: not the consumer's
		w := e.txnWriter("tx")
		w.begin()
		open := w.write("o-0", "o-1", "o-2")
		cfg := e.txnConfig(idRules[0], false)
		cfg.StartOffset = consumer.StartLatest
		held := &heldWatch{}
		cfg.Hooks = append(cfg.Hooks, held)
		r := e.start(cfg)
		if kafkaClient() == consumer.FranzGo {
			waitFor(t, 30*time.Second, "the open transaction reported", func() bool { return len(held.snapshot()) > 0 })
		} else {
			waitFor(t, 30*time.Second, "the partition assigned", func() bool { return len(e.events.snapshot().assigned) > 0 })
		}
		require.Equal(t, map[int]int64{0: open[0].Offset}, e.storedPositions(), "the first start is the open transaction's first record")
		w.end(true)
		finish(e, r, e.ids(idRules[0], open))
	})

	// A transaction aborted and tried again with the same records: each
	// record is applied once, at the offsets of the committed attempt.
	t.Run("AbortedThenRetriedWithTheSameRecords", func(t *testing.T) {
		eachIDRuleAndHandler(t, func(t *testing.T, rule idRule, batch bool) {
			e := setup(t, 1)
			w := e.txnWriter("tx")
			w.begin()
			w.write("r-0", "r-1", "r-2")
			w.end(false)
			w.begin()
			retried := w.write("r-0", "r-1", "r-2")
			w.end(true)
			run(e, e.txnConfig(rule, batch), e.ids(rule, retried))
		})
	})

	// Many small transactions, committed and aborted, between records
	// written outside any.
	t.Run("ManySmallTransactionsBetweenPlainRecords", func(t *testing.T) {
		eachIDRuleAndHandler(t, func(t *testing.T, rule idRule, batch bool) {
			e := setup(t, 1)
			w := e.txnWriter("tx")
			var want [][]*kgo.Record
			for i := range 20 {
				w.begin()
				recs := w.write("t-"+strconv.Itoa(i)+"-a", "t-"+strconv.Itoa(i)+"-b")
				w.end(i%3 != 0)
				if i%3 != 0 {
					want = append(want, recs)
				}
				want = append(want, e.plain("plain-"+strconv.Itoa(i)))
			}
			run(e, e.txnConfig(rule, batch), e.ids(rule, want...))
		})
	})

	// A producer fenced mid-transaction by a new one with its
	// transactional id: the broker aborts the fenced one's records.
	t.Run("ProducerFencedMidTransaction", func(t *testing.T) {
		eachIDRuleAndHandler(t, func(t *testing.T, rule idRule, batch bool) {
			e := setup(t, 1)
			id := testenv.Name(t, "fenced")
			old := e.txnWriterOf(id)
			old.begin()
			old.write("f-0", "f-1")
			fresh := e.txnWriterOf(id)
			fresh.begin()
			committed := fresh.write("n-0", "n-1")
			fresh.end(true)
			err := old.cl.EndTransaction(context.Background(), kgo.TryCommit)
			require.Error(t, err, "the fenced producer committed")
			run(e, e.txnConfig(rule, batch), e.ids(rule, committed))
		})
	})
}

// A kafka-go consumer of a transactional topic stops at the first marker,
// naming the franz-go client as the fix; the franz-go one is not affected.
func TestTheKafkaGoClientRefusesTransactionalTopics(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	w := e.txnWriter("tx")
	w.begin()
	w.write("c-0")
	w.end(true)
	cfg := e.config(e.applyHandler())
	cfg.KafkaClient = consumer.KafkaGo
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "the partition stopped at the marker", func() bool { return e.events.stoppedWith(consumer.ErrTransactionalTopic) })
	r.stop()
	stop := e.events.snapshot().stopped[0]
	require.Contains(t, stop.Error(), "consumer.FranzGo")
	var merr *consumer.MessageError
	require.True(t, errors.As(stop, &merr))
	require.EqualValues(t, 1, merr.Offset, "the marker's offset")
}
