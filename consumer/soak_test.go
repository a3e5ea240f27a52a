package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// TestSoak runs random faults, from a seed, during a long run of three
// members on six partitions, then checks the invariants. Odd seeds run a
// per-message Handler, even seeds a BatchHandler whose batches go in one
// round trip. By default it runs
// seed 1 with 10,000 messages; CI runs two seeds with 100,000; the long run
// is
//
//	KAFKAONCE_SOAK_SEEDS="1 2 3 4 5" KAFKAONCE_SOAK_MESSAGES=100000 go test ./consumer -run TestSoak -timeout 60m -v
//
// A failing seed is printed; run it again with KAFKAONCE_SOAK_SEEDS=<seed>.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak is skipped in -short runs (CI runs it in a step of its own)")
	}
	soakSeeds(t, "KAFKAONCE_SOAK_MESSAGES", 10000, soak)
}

// soakSeeds runs run once per seed of KAFKAONCE_SOAK_SEEDS (seed 1 by
// default) over the messages messagesVar says (n by default), each seed a
// parallel subtest that says how to run it again when it fails.
func soakSeeds(t *testing.T, messagesVar string, n int, run func(t *testing.T, seed uint64, n int)) {
	seeds := []uint64{1}
	if s := os.Getenv("KAFKAONCE_SOAK_SEEDS"); s != "" {
		seeds = nil
		for _, f := range strings.Fields(s) {
			v, err := strconv.ParseUint(f, 10, 64)
			require.NoError(t, err, "KAFKAONCE_SOAK_SEEDS")
			seeds = append(seeds, v)
		}
	}
	if s := os.Getenv(messagesVar); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(t, err, messagesVar)
	}
	for _, seed := range seeds {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			t.Parallel()
			defer func() {
				if t.Failed() {
					t.Logf("%s failed: reproduce with KAFKAONCE_SOAK_SEEDS=%d %s=%d", t.Name(), seed, messagesVar, n)
				}
			}()
			run(t, seed, n)
		})
	}
}

// soakTransfer is the transfer a soak message posts, if it is one of the
// hot-rows phase's: every third wave of 500.
func soakTransfer(id string) (transfer, bool) {
	_, num, ok := strings.Cut(id, "-")
	i, err := strconv.Atoi(num)
	if !ok || err != nil || i/500%3 != 1 {
		return transfer{}, false
	}
	from := i % 4
	return transfer{from: from, to: (from + 1 + i/4%3) % 4}, true
}

// soakTxnCounts counts the transactional phase's transactions.
type soakTxnCounts struct{ committed, aborted atomic.Int64 }

// soakTransactions writes ids in committed transactions of 50, spread over
// the partitions, with an aborted one (of ids "<id>-aborted") before one in
// four of them. A transaction whose end fails (the broker's connections
// were cut) is written again: the ids of one that committed all the same
// come twice, as producer re-sends do.
func soakTransactions(w *txnWriter, prng *rand.Rand, ids []string, partitions int, counts *soakTxnCounts) {
	records := func(ids []string, suffix string) []*kgo.Record {
		recs := make([]*kgo.Record, len(ids))
		for j, id := range ids {
			recs[j] = txnRecord(j%partitions, id+suffix)
			recs[j].Value = []byte("v")
		}
		return recs
	}
	try := func(recs []*kgo.Record, commit bool) bool {
		if w.cl.BeginTransaction() != nil {
			return false
		}
		err := w.cl.ProduceSync(context.Background(), recs...).FirstErr()
		return w.cl.EndTransaction(context.Background(), kgo.TransactionEndTry(commit && err == nil)) == nil && err == nil
	}
	for i := 0; i < len(ids); i += 50 {
		chunk := ids[i:min(i+50, len(ids))]
		if prng.IntN(4) == 0 {
			try(records(chunk, "-aborted"), false)
			counts.aborted.Add(1)
		}
		for !try(records(chunk, ""), true) {
			time.Sleep(50 * time.Millisecond)
		}
		counts.committed.Add(1)
	}
}

// fate of a message in the soak, from its id and the seed, so that a seed
// always poisons and troubles the same messages.
func soakFate(seed uint64, id string) (poison, flaky bool) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", seed, id)
	v := h.Sum64() % 1000
	return v == 7, v < 4
}

func soak(t *testing.T, seed uint64, n int) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	const partitions = 6
	var k *testenv.Kafka
	var kl *faultproxy.Listener
	if os.Getenv("KAFKA_BROKERS") == "" {
		k, kl = faultyKafka(t, kfake.SeedTopics(partitions))
	} else {
		k = testenv.NewKafka(t) // a real broker: no faults on the Kafka side
	}
	e := setupOn(t, partitions, k)
	if kl == nil {
		e.topic = k.Topic(t, partitions)
	}
	proxy, err := faultproxy.Start(e.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })

	var attempts sync.Map
	trouble := func(m *consumer.Message) error {
		poison, flaky := soakFate(seed, m.ID)
		if poison {
			return consumer.Permanent(errors.New("poison"))
		}
		if flaky {
			c, _ := attempts.LoadOrStore(m.ID, new(atomic.Int32))
			if c.(*atomic.Int32).Add(1) <= 2 {
				return errors.New("transient")
			}
		}
		return nil
	}
	// The hot-rows phase: every third wave of messages also posts a
	// transfer between two of four accounts, so that the members' batches
	// deadlock and lose serialization races while the faults go on.
	hot := newLedger(e, 4)
	var cfg *consumer.Config
	if seed%2 == 1 {
		// Odd seeds: a Handler, a statement per message, and for hot
		// messages the two accounts, the lower id first.
		cfg = e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if err := trouble(m); err != nil {
				return err
			}
			if err := e.applyHandler().Handle(ctx, tx, m); err != nil {
				return err
			}
			if t, ok := soakTransfer(m.ID); ok {
				return hot.post(ctx, tx, t)
			}
			return nil
		}))
	} else {
		// Even seeds: a BatchHandler that only queues, so batches of new
		// messages go in one round trip, and fall back to claiming first
		// under the same faults.
		cfg = batchConfig(e, &batchEffects{e: e, before: func(msgs []*consumer.Message) error {
			for _, m := range msgs {
				if err := trouble(m); err != nil {
					return err
				}
			}
			return nil
		}, extra: func(b *consumer.Batch) {
			// Hot messages' postings in message order: sorted within a
			// transfer, not across the batch, as a per-message loop
			// queued one after another would be.
			for _, m := range b.Messages {
				if t, ok := soakTransfer(m.ID); ok {
					hot.queue(b, t)
				}
			}
		}})
	}
	contended := &contentions{}
	cfg.Hooks = append(cfg.Hooks, contended)
	cfg.MaxBatch = 200
	cfg.Retry.MaxAttempts = 5
	cfg.Retry.InitialInterval = time.Millisecond
	cfg.Retry.MaxInterval = 20 * time.Millisecond
	cfg.LockTimeout = time.Second
	pool := e.db.PoolVia(t, proxy.Addr(), testenv.MaxConns(20))
	startMember := func() *running {
		c, err := consumer.New(pool, cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		r := &running{t: t, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- c.Run(ctx) }()
		return r
	}
	members := []*running{startMember(), startMember(), startMember()}
	defer func() {
		for _, m := range members {
			m.stop()
		}
	}()

	// The producer: n ids in waves, 2% sent twice.
	var ids, poison []string
	for i := range n {
		id := fmt.Sprintf("s%d-%06d", seed, i)
		ids = append(ids, id)
		if p, _ := soakFate(seed, id); p {
			poison = append(poison, id)
		}
	}
	// The producer's pace sets how long the run lasts, and so how many
	// faults it meets: a BatchHandler keeps up with anything, so it gets a
	// slower producer than a Handler falls behind.
	pace := 10 * time.Millisecond
	if seed%2 == 0 {
		pace = 100 * time.Millisecond
	}
	// The transactional phase: every fifth wave is written by a
	// transactional producer, in transactions of 50 records, one in four
	// of which it aborts after writing records of ids of its own, which
	// must never be applied (they are not among ids: applied, they are
	// phantoms). The kafka-go client cannot read such a topic and stops at
	// its first marker, so it meets no transactional phase.
	txnPhase := kafkaClient() == consumer.FranzGo
	var txw *txnWriter
	var kafkaTxns soakTxnCounts
	if txnPhase {
		txw = e.txnWriter("soak")
	}
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		w := e.kafka.Writer(e.topic)
		defer w.Close()
		prng := rand.New(rand.NewPCG(seed, 2))
		for i := 0; i < n; i += 500 {
			if txnPhase && i/500%5 == 3 {
				soakTransactions(txw, prng, ids[i:min(i+500, n)], partitions, &kafkaTxns)
				time.Sleep(pace)
				continue
			}
			var msgs []kafka.Message
			for j := i; j < min(i+500, n); j++ {
				m := msg(j%partitions, ids[j], "v")
				msgs = append(msgs, m)
				if prng.IntN(50) == 0 {
					msgs = append(msgs, m)
				}
			}
			for {
				if err := w.WriteMessages(context.Background(), msgs...); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond) // the broker's connections were cut
			}
			time.Sleep(pace)
		}
	}()

	// Faults, until the producer is done and 95% of the messages are
	// applied, less those deleted (at most ten minutes).
	faults := map[string]int{}
	deleted := &deletions{}
	limit := time.Now().Add(10 * time.Minute)
	done := func() bool {
		select {
		case <-produced:
			return e.effectsOr0() >= int64(n)*95/100-int64(deleted.count())
		default:
			return false
		}
	}
	// Faults wait while nothing progresses: a member restart triggers a
	// rebalance, and restarts (or cut broker connections) arriving faster
	// than the group can finish rebalancing keep it from ever forming a
	// generation, with any broker (the in-process one is slower to settle
	// than Kafka). The invariants are checked all the same; only liveness
	// needs the pause.
	stopAll := func() {
		for _, m := range members {
			m.stop()
		}
	}
	startAll := func() {
		for i := range members {
			members[i] = startMember()
		}
	}
	watch := &stuckGroupWatch{e: e, group: cfg.GroupID, faults: faults, restartAll: func() { stopAll(); startAll() }}
	operator := &lossOperator{e: e, faults: faults, stopAll: stopAll, startAll: startAll}
	var lastEffects int64
	lastProgress := time.Now()
	retentionMet, crowded := false, false
	for !done() && time.Now().Before(limit) {
		time.Sleep(time.Duration(300+rng.IntN(600)) * time.Millisecond)
		if watch.check() || operator.check() {
			continue
		}
		if n := e.effectsOr0(); n > lastEffects {
			lastEffects, lastProgress = n, time.Now()
		}
		if time.Since(lastProgress) > 3*time.Second {
			faults["paused: no progress"]++
			continue
		}
		f := rng.IntN(8)
		switch {
		case !retentionMet:
			// Every run meets retention at least once, early: ahead of
			// the stored position, unless the members are caught up. Once
			// every partition has one: messages deleted before a consumer
			// first started a partition were never its to process.
			if len(e.storedPositions()) < e.parts {
				continue
			}
			retentionMet, f = true, -1
		case !crowded:
			// And more members than partitions, once.
			crowded, f = true, -2
		}
		switch f {
		case -2:
			crowd(t, e, cfg.GroupID, len(members), startMember)
			faults["members outnumbered partitions: the group stayed quiet"]++
		case -1:
			faults[retentionDelete(e, deleted, rng, true)]++
		case 0:
			i := rng.IntN(len(members))
			members[i].stop()
			members[i] = startMember()
			faults["member restart"]++
		case 1:
			proxy.CutAll()
			faults["postgres connections cut"]++
		case 2:
			if kl != nil && rng.IntN(2) == 0 {
				kl.CutAll()
				faults["kafka connections cut"]++
			}
		case 3:
			proxy.DropAfterCommits(1)
			faults["COMMIT reply lost"]++
		case 4:
			d := time.Duration(rng.IntN(3)) * time.Millisecond
			proxy.SetLatency(d)
			if kl != nil {
				kl.SetLatency(d)
			}
			faults["latency changed"]++
		case 5:
			faults[retentionDelete(e, deleted, rng, rng.IntN(2) == 0)]++
		}
	}
	proxy.SetLatency(0)
	proxy.DropAfterCommits(0)
	if kl != nil {
		kl.SetLatency(0)
	}
	if !crowded {
		// A short run: it meets the crowd while it drains.
		crowd(t, e, cfg.GroupID, len(members), startMember)
		faults["members outnumbered partitions: the group stayed quiet"]++
	}
	e.waitDrained(3*time.Minute, func() { watch.check(); operator.check() })
	// Kafka's offsets catch up while the members run; stopping them one by
	// one causes rebalances in which the last commits are refused as
	// fenced (harmless: the stored positions decide, and the next
	// assignment brings the offsets up to date).
	ends := map[int]int64{}
	for p, pos := range e.storedPositions() {
		ends[p] = pos
	}
	e.waitCommitted(ends, time.Minute)
	for _, m := range members {
		m.stop()
	}
	lost, _, _ := contended.count()
	t.Logf("seed %d: %d messages (%d poison) over %d partitions with 3 members; %d transactions lost races for rows; Kafka transactions: %d committed, %d aborted; faults: %v",
		seed, n, len(poison), partitions, lost, kafkaTxns.committed.Load(), kafkaTxns.aborted.Load(), faults)
	e.check(expectation{ids: ids, poison: poison, deleted: deleted})
	// Each applied hot message posted its transfer once.
	applied := 0
	for id := range e.countsBy(`SELECT message_id, count(*) FROM ` + e.db.Table("effects") + ` GROUP BY message_id`) {
		if _, ok := soakTransfer(id); ok {
			applied++
		}
	}
	require.Positive(t, applied, "the hot-rows phase ran")
	hot.requireBalanced(applied)
}

// crowd starts members beside the before running ones, up to two more
// than there are partitions, waits for the group to settle, and requires
// it to stay quiet for a while: no
// partition assigned anew, and (with the in-process broker) no JoinGroup at
// all. An idle member that ended its generation would rejoin at once, and
// when it leads the group, make every member rebalance. Then the extra
// members leave.
func crowd(t *testing.T, e *env, group string, before int, startMember func() *running) {
	t.Helper()
	var joins atomic.Int64
	var counting atomic.Bool
	if e.kafka.Fake != nil {
		e.kafka.Fake.ControlKey(kmsg.JoinGroup.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if counting.Load() && req.(*kmsg.JoinGroupRequest).Group == group {
				joins.Add(1)
			}
			return nil, nil, false // observe only
		})
	}
	total := e.parts + 2 // two members with nothing to do
	added := make([]*running, total-before)
	for i := range added {
		added[i] = startMember()
	}
	assignments := func() int { return len(e.events.snapshot().assigned) }
	last, since := assignments(), time.Now()
	waitFor(t, time.Minute, "the crowded group to settle", func() bool {
		if n := assignments(); n != last {
			last, since = n, time.Now()
		}
		// Until every new member has joined, the group may be Stable in
		// the generation before them.
		state, members, held, err := e.kafka.GroupAssignment(group, e.topic)
		return err == nil && state == "Stable" && members == total && held == e.parts && time.Since(since) > 2*time.Second
	})
	counting.Store(true)
	time.Sleep(4 * time.Second)
	counting.Store(false)
	require.Equal(t, last, assignments(), "partitions assigned while the crowded group should have stayed quiet")
	require.Zero(t, joins.Load(), "members joined the group again while it should have stayed quiet")
	for _, m := range added {
		m.stop()
	}
}

// retentionDelete deletes the records of a random partition below a random
// offset, as retention would: ahead of the stored position, anywhere up to
// the log end (the members may have fetched the messages, which are then
// processed, or not, and then they must report them), or behind it
// (processed messages: nothing to report). It returns the fault's name.
func retentionDelete(e *env, deleted *deletions, rng *rand.Rand, ahead bool) string {
	p := rng.IntN(e.parts)
	stored := e.storedPositions()[p]
	b := e.logBounds(p)
	before := stored - int64(rng.IntN(100))
	what := "retention delete behind the stored position"
	if ahead && b[1] > stored {
		before = stored + 1 + rng.Int64N(b[1]-stored)
		what = "retention delete ahead of the stored position"
	}
	if before <= b[0] {
		return what + ": nothing to delete"
	}
	e.deleteRecordsBefore(deleted, p, before)
	e.t.Logf("retention delete: partition %d below %d (stored position %d, log %d to %d)", p, before, stored, b[0], b[1])
	return what
}

// lossOperator does what the operator of a partition stopped by
// ErrMessagesDeleted does to accept the loss: with the members stopped,
// move its stored position and group offset to the log start reported,
// then start the members again.
type lossOperator struct {
	e                 *env
	faults            map[string]int
	stopAll, startAll func()
	handled           int // reports seen
}

// check acts on the reports that came since the last look, and reports
// whether it did.
func (o *lossOperator) check() bool {
	stopped := o.e.events.snapshot().stopped
	reset := map[int]int64{}
	for _, s := range stopped[o.handled:] {
		var d *consumer.MessagesDeletedError
		if errors.As(s, &d) {
			reset[d.Partition] = max(reset[d.Partition], d.LogStart)
		}
	}
	o.handled = len(stopped)
	stored := o.e.storedPositions()
	for p, to := range reset {
		if stored[p] >= to {
			delete(reset, p) // reported by a member that lost the partition meanwhile
		}
	}
	if len(reset) == 0 {
		return false
	}
	o.stopAll()
	for p, to := range reset {
		o.e.acceptLoss(p, to)
	}
	o.startAll()
	o.faults["messages deleted unprocessed: the operator reset the partition"]++
	return true
}

// stuckGroupWatch ends a stall that is the broker's own. kfake's classic
// group coordinator answers a JoinGroup when every member it holds has
// rejoined, or when its rebalance timer runs out; and it restarts that
// timer at every JoinGroup (Kafka does not: its deadline runs from the
// start of the rebalance). A member whose JoinGroup answer went to a
// connection already closed (cut, or a member shutting down while it
// waited) stays in the group, never rejoins and gets no session timer, so
// only the timer can complete the rebalance; kafka-go gives up on a
// JoinGroup after 5 s plus the rebalance timeout and joins again, and
// members that gave up at different moments keep restarting the timer, for
// ever (about one soak run in four before this watch: every member waiting
// in JoinGroup, none answered, for minutes). Restarting every member at
// once ends it, as it would for an operator.
//
// The watch acts only when nothing has moved (effects and stored
// positions) for 20 s and the coordinator reports the group outside
// Stable: a worker of ours that stopped making progress leaves its group
// Stable, and one that would not let its generation end fails the restart
// (stop requires Run to return within 30 s). The invariants are checked
// all the same.
type stuckGroupWatch struct {
	e          *env
	group      string
	faults     map[string]int
	restartAll func()

	moved                         int64
	movedAt, checkedAt, restartAt time.Time
}

// check restarts every member when the group is stuck (see above), and
// reports whether it did. It looks at most once a second.
func (w *stuckGroupWatch) check() bool {
	now := time.Now()
	if now.Sub(w.checkedAt) < time.Second {
		return false
	}
	w.checkedAt = now
	moved := w.e.effectsOr0()
	for _, next := range w.e.storedPositions() {
		moved += next
	}
	if moved != w.moved || w.movedAt.IsZero() {
		w.moved, w.movedAt = moved, now
		return false
	}
	if now.Sub(w.movedAt) < 20*time.Second || now.Sub(w.restartAt) < 30*time.Second {
		return false
	}
	state, err := w.e.kafka.GroupState(w.group)
	if err == nil && state == "Stable" {
		return false
	}
	w.e.t.Logf("nothing moved for %s and the group is %q (%v): restarting every member", now.Sub(w.movedAt).Round(time.Second), state, err)
	w.restartAll()
	w.restartAt = time.Now()
	w.faults["group stuck outside Stable: every member restarted"]++
	return true
}

// waitDrained waits until every partition's stored position is at the log
// end, calling between before each look.
func (e *env) waitDrained(timeout time.Duration, between func()) {
	e.t.Helper()
	conn, err := kafka.Dial("tcp", e.kafka.Brokers[0])
	require.NoError(e.t, err)
	defer conn.Close()
	waitFor(e.t, timeout, "every partition drained", func() bool {
		between()
		stored := e.storedPositions()
		for p := range e.parts {
			c, err := kafka.DialLeader(context.Background(), "tcp", e.kafka.Brokers[0], e.topic, p)
			if err != nil {
				return false
			}
			last, err := c.ReadLastOffset()
			c.Close()
			if err != nil || stored[p] != last {
				return false
			}
		}
		return true
	})
}
