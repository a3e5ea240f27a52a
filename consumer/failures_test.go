package consumer_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
)

// batchErrors is a hook collecting the errors of failed batch transactions.
type batchErrors struct {
	mu   sync.Mutex
	errs []error
}

func (b *batchErrors) OnBatchEnd(_ context.Context, _ consumer.BatchInfo, r consumer.BatchResult) {
	if r.Err != nil {
		b.mu.Lock()
		b.errs = append(b.errs, r.Err)
		b.mu.Unlock()
	}
}

func (b *batchErrors) containing(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, err := range b.errs {
		if strings.Contains(err.Error(), s) {
			n++
		}
	}
	return n
}

func TestCommitReplyLostAppliesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	proxy, err := faultproxy.Start(e.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	pool := e.db.PoolVia(t, proxy.Addr())

	// The first batch's COMMIT reaches the server, which commits; the
	// connection is cut before the reply gets back. The consumer must
	// neither commit the Kafka offset on a guess nor apply the batch a
	// second time.
	errs := &batchErrors{}
	cfg := e.config(e.applyHandler())
	cfg.Hooks = append(cfg.Hooks, errs, armOnFirstBatch{proxy: proxy, once: &sync.Once{}})
	c, err := consumer.New(pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.waitRecorded()
	ids := e.produceIDs("c", 50)

	e.waitCommitted(map[int]int64{0: 50}, 30*time.Second)
	cancel()
	require.NoError(t, <-done)

	require.EqualValues(t, 1, proxy.Dropped(), "the fault was injected")
	require.Equal(t, 1, errs.containing("commit outcome unknown"), "the lost reply was seen as an unknown outcome")
	e.requireExactlyOnce(ids)
	require.Equal(t, 50, e.events.snapshot().applied+e.events.snapshot().skipped[consumer.SkipAlreadyClaimed])
	require.Equal(t, map[int]int64{0: 50}, e.storedPositions())
	e.check(expectation{ids: ids})
}

// armOnFirstBatch makes the proxy drop the reply to the next COMMIT once the
// first batch starts: that COMMIT is the batch's.
// waitRecorded waits until a member of the test's consumer has recorded
// its settings: a transaction of its own, made once the member joined its
// group, which a test dropping the next COMMIT's reply must not meet.
func (e *env) waitRecorded() {
	e.t.Helper()
	waitFor(e.t, 30*time.Second, "the consumer's settings recorded", func() bool {
		return e.db.Int(e.t, `SELECT count(*) FROM `+e.db.Table("consumers")+` WHERE name = $1 AND settings_recorded_at IS NOT NULL`, e.name) == 1
	})
}

// armOnFirstBatch makes the proxy drop the reply of the next COMMIT once
// the first batch starts. Start the consumer before producing, and wait
// for its settings record (waitRecorded): the batch's COMMIT is then the
// next one.
type armOnFirstBatch struct {
	proxy *faultproxy.Proxy
	once  *sync.Once
}

func (a armOnFirstBatch) OnBatchStart(context.Context, consumer.BatchInfo) {
	a.once.Do(func() { a.proxy.DropAfterCommits(1) })
}

func TestTransientFailureRetriesOnlyTheFailingMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("t", 30)
	var calls sync.Map // message id -> *atomic.Int32
	var failures atomic.Int32
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		n, _ := calls.LoadOrStore(m.ID, new(atomic.Int32))
		if m.ID == "t-10" && failures.Load() < 3 {
			failures.Add(1)
			return errors.New("partner API unavailable")
		}
		n.(*atomic.Int32).Add(1)
		return e.applyHandler().Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	e.waitEffects(len(ids), 30*time.Second)
	e.waitCommitted(map[int]int64{0: 30}, 15*time.Second)
	r.stop()

	e.requireExactlyOnce(ids)
	require.EqualValues(t, 3, failures.Load())
	// The messages before t-10 ran in the first transaction (rolled back)
	// and once more in the prefix transaction; t-10 then ran alone until it
	// succeeded; the ones after it ran once.
	for i, id := range ids {
		v, _ := calls.Load(id)
		got := v.(*atomic.Int32).Load()
		switch {
		case i < 10:
			require.EqualValues(t, 2, got, "handler runs of %s", id)
		default:
			require.EqualValues(t, 1, got, "successful handler runs of %s", id)
		}
	}
	e.check(expectation{ids: ids})
}

func TestHandlerThatCommitsOrPanicsStopsThePartitionUnderStopPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	e.kafka.Produce(t, e.topic,
		msg(0, "ok0", "ok"), msg(0, "commits", "x"), msg(0, "after0", "ok"),
		msg(1, "ok1", "ok"), msg(1, "panics", "x"), msg(1, "after1", "ok"),
	)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := e.applyHandler().Handle(ctx, tx, m); err != nil {
			return err
		}
		switch m.ID {
		case "commits":
			_ = tx.Commit(ctx) // refused; the handler even ignores the error
		case "panics":
			var m map[string]int
			//lint:ignore SA5000 the handler panics on purpose
			m["boom"]++
		}
		return nil
	})
	cfg := e.config(h)
	cfg.OnPermanentFailure = consumer.StopPartition
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "both partitions stopped", func() bool { return len(e.events.snapshot().stopped) == 2 })
	r.stop()

	e.requireExactlyOnce([]string{"ok0", "ok1"})
	require.True(t, e.events.stoppedWith(consumer.ErrTxControlledByConsumer))
	require.True(t, e.events.stoppedWith(consumer.ErrHandlerPanicked))
	for _, s := range e.events.snapshot().stopped {
		if errors.Is(s, consumer.ErrHandlerPanicked) {
			require.Contains(t, s.Error(), "assignment to entry in nil map")
			require.Contains(t, s.Error(), "failures_test.go", "the stack is kept")
		}
	}
}

func TestSessionTimeoutsAreSetForTheTransactionOnly(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("s", 1)
	got := make(chan [3]string, 1)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var s [3]string
		err := tx.QueryRow(ctx, `SELECT current_setting('statement_timeout'), current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')`).Scan(&s[0], &s[1], &s[2])
		got <- s
		return err
	})
	cfg := e.config(h)
	cfg.StatementTimeout = 1500 * time.Millisecond
	cfg.LockTimeout = 700 * time.Millisecond
	cfg.IdleInTransactionTimeout = 20 * time.Second
	cfg.HandlerTimeout = 10 * time.Second
	r := e.start(cfg)
	require.Equal(t, [3]string{"1500ms", "700ms", "20s"}, <-got)
	r.stop()

	var outside string
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT current_setting('statement_timeout')`).Scan(&outside))
	require.Equal(t, "0", outside, "connections go back to the pool unchanged")
}

func TestShutdownFinishesTheBatchInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("d", 5)
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		once.Do(func() { close(entered); <-release })
		return e.applyHandler().Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	<-entered
	go func() {
		time.Sleep(300 * time.Millisecond) // Run's context is cancelled meanwhile
		close(release)
	}()
	r.stop()

	e.requireExactlyOnce([]string{"d-0", "d-1", "d-2", "d-3", "d-4"})
	require.Equal(t, map[int]int64{0: 5}, e.storedPositions())
	require.Equal(t, map[int]int64{0: 5}, e.kafka.CommittedOffsets(t, e.group, e.topic, 1), "the drained batch's offset was committed on the way out")
}

func TestShutdownTimeoutAbortsAHungBatch(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("h", 3)
	entered := make(chan struct{})
	var once sync.Once
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := e.applyHandler().Handle(ctx, tx, m); err != nil {
			return err
		}
		once.Do(func() { close(entered) })
		<-ctx.Done() // a handler waiting on something that never comes
		return ctx.Err()
	})
	cfg := e.config(h)
	cfg.ShutdownTimeout = 300 * time.Millisecond
	r := e.start(cfg)
	<-entered
	began := time.Now()
	r.stop()
	require.Less(t, time.Since(began), 10*time.Second)

	require.Zero(t, e.effects(), "the aborted batch rolled back")
	require.Equal(t, map[int]int64{0: 0}, e.storedPositions(), "the position is still the first start")
}

func TestStoredPositionBeyondTheLogStopsThePartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	e.produceIDs("a", 10)
	// As if the topic had been deleted and re-created: the stored position
	// of partition 1 is far beyond the new log's end.
	e.db.Exec(t, `INSERT INTO `+e.db.Table("consumer_offsets")+` (consumer, topic, partition, next_offset) VALUES ($1, $2, 1, 1000)`, e.name, e.topic)

	r := e.start(e.config(e.applyHandler()))
	e.waitEffects(5, 30*time.Second)
	waitFor(t, 30*time.Second, "partition 1 stopped", func() bool { return len(e.events.snapshot().stopped) == 1 })
	r.stop()

	s := e.events.snapshot().stopped[0]
	require.Equal(t, 1, s.Partition)
	require.ErrorIs(t, s, consumer.ErrPositionAheadOfLog)
	require.Contains(t, s.Error(), "stored position is 1000 but the log ends at 5")
	require.EqualValues(t, 5, e.effects(), "partition 0 went on; partition 1 applied nothing")
}

func TestMessagesDeletedBeforeProcessingStopThePartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("k", 10)
	r := e.start(e.config(e.applyHandler()))
	e.waitEffects(10, 30*time.Second)
	e.waitCommitted(map[int]int64{0: 10}, 15*time.Second)
	r.stop()

	// While the consumer is down, 10 more arrive and retention removes all
	// but the last 3 of them.
	more := e.produceIDs("k2", 10)
	e.kafka.DeleteRecordsBefore(t, e.topic, 0, 17)

	r = e.start(e.config(e.applyHandler()))
	waitFor(t, 30*time.Second, "the partition stopped", func() bool { return len(e.events.snapshot().stopped) == 1 })
	r.stop()

	s := e.events.snapshot().stopped[0]
	require.ErrorIs(t, s, consumer.ErrMessagesDeleted)
	require.Contains(t, s.Error(), "offsets 10 to 16 are gone")
	require.EqualValues(t, 10, e.effects(), "nothing after the gap was applied behind the operator's back")
	_ = more
}

func TestPermanentFailureBehindAFlakyPrefixStopsAtTheRightMessage(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("f", 10)
	// f-0 fails once (transiently) but only when f-6 has been seen to panic:
	// the prefix transaction [f-0..f-5] then fails at its first message.
	var panicked, flaked atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "f-6":
			panicked.Store(true)
			panic("poison")
		case m.ID == "f-0" && panicked.Load() && !flaked.Swap(true):
			return errors.New("flaky")
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.OnPermanentFailure = consumer.StopPartition
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "the partition stopped", func() bool { return len(e.events.snapshot().stopped) == 1 })
	r.stop()

	require.True(t, flaked.Load(), "the flaky prefix happened")
	e.requireExactlyOnce(ids[:6])
	var merr *consumer.MessageError
	require.ErrorAs(t, e.events.snapshot().stopped[0], &merr)
	require.Equal(t, "f-6", merr.MessageID, "the stop names the poison message, not the flaky one")
	require.ErrorIs(t, merr, consumer.ErrHandlerPanicked)
}

func TestRunWaitsForPostgresAtStartup(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("w", 5)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close() // nothing listens there yet: connections are refused
	r := e.start(func() *consumer.Config {
		cfg := e.config(e.applyHandler())
		return cfg
	}(), e.db.PoolVia(t, addr))
	time.Sleep(time.Second)
	proxy, err := faultproxy.StartOn(addr, e.db.ServerAddr(t)) // the database comes up
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	r.stop()
	e.check(expectation{ids: ids})
}

// sessionWatch is a pgx tracer that records the first statement of every
// transaction begun on the connections it watches, however it was begun:
// with Begin, or with BEGIN at the head of a pipeline.
type sessionWatch struct {
	mu    sync.Mutex
	begun map[*pgx.Conn]bool // a BEGIN was sent, its first statement not yet
	first []string
}

func (s *sessionWatch) see(conn *pgx.Conn, sql string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.begun[conn] {
		s.first = append(s.first, sql)
		s.begun[conn] = false
	}
	if strings.EqualFold(strings.TrimSpace(sql), "begin") {
		if s.begun == nil {
			s.begun = map[*pgx.Conn]bool{}
		}
		s.begun[conn] = true
	}
}

func (s *sessionWatch) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.see(conn, data.SQL)
	return ctx
}

func (s *sessionWatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *sessionWatch) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	for _, q := range data.Batch.QueuedQueries {
		s.see(conn, q.SQL)
	}
	return ctx
}

func (s *sessionWatch) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (s *sessionWatch) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// Every transaction the consumer runs starts by setting the session
// timeouts: batches, attempts recorded and failed, a partition's start and
// end, reading its position, dead letters written and redriven.
func TestEveryTransactionSetsTheSessionTimeouts(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("s", 4)
	var fixed atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "s-1" && !fixed.Load():
			return consumer.Permanent(errors.New("rejected"))
		case m.ID == "s-2" && !fixed.Load():
			fixed.Store(true)
			return errors.New("flaky") // retried alone: attempts recorded
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	watch := &sessionWatch{}
	db := e.db.PoolVia(t, e.db.ServerAddr(t), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = watch })
	cfg := e.config(h)
	r := e.start(cfg, db)
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	r.stop()
	c, err := consumer.New(db, cfg)
	require.NoError(t, err)
	res, err := c.Redrive(context.Background(), consumer.RedriveFilter{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Applied)

	watch.mu.Lock()
	defer watch.mu.Unlock()
	require.Greater(t, len(watch.first), 8)
	for _, sql := range watch.first {
		require.Contains(t, sql, "set_config('statement_timeout'", "a transaction that starts without the timeouts")
	}
	e.requireExactlyOnce(ids)
}

// A transaction that sets a message aside commits its dead letter with the
// rest of the batch; here its COMMIT reaches the server, which commits, and
// the reply is lost. The outcome is unknown, so the batch runs again with
// the same plan: the claims find every message, the one set aside among
// them (claimed dead-lettered, with the same content), so nothing is
// applied twice and no second letter is written for it; the Kafka offset
// waits for the run that knows.
func TestCommitReplyLostWithADeadLetterInTheBatchSetsItAsideOnce(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		proxy, err := faultproxy.Start(e.db.ServerAddr(t))
		require.NoError(t, err)
		t.Cleanup(func() { proxy.Close() })

		const victim = "d-2"
		poison := func(m *consumer.Message) error {
			if m.ID == victim {
				return consumer.Permanent(errors.New("undecodable"))
			}
			return nil
		}
		cfg := e.checkedConfig(batched, poison)
		// The first transaction fails on the victim and rolls back (no
		// COMMIT); the next one (for a BatchHandler: one call per message,
		// each in a savepoint) sets it aside and commits.
		const n = 2
		errs := &batchErrors{}
		cfg.Hooks = append(cfg.Hooks, errs, armOnBatch{proxy: proxy, n: n, batches: &atomic.Int32{}})
		ids := e.produceIDs("d", 6)
		r := e.start(cfg, e.db.PoolVia(t, proxy.Addr()))
		e.waitCommitted(map[int]int64{0: 6}, 60*time.Second)
		r.stop()

		require.EqualValues(t, 1, proxy.Dropped(), "the fault was injected")
		require.Equal(t, 1, errs.containing("commit outcome unknown"), "the lost reply was seen as an unknown outcome: %v", errs.errs)
		require.EqualValues(t, 1, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE message_id = $1`, victim), "letters for the victim")
		require.Equal(t, map[int]int64{0: 6}, e.storedPositions())
		e.check(expectation{ids: ids, poison: []string{victim}})
	})
}
