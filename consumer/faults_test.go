package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/pgcluster"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// faultyKafka starts an in-process broker of the test's own whose
// connections go through a fault-injecting listener.
func faultyKafka(t *testing.T, opts ...kfake.Opt) (*testenv.Kafka, *faultproxy.Listener) {
	t.Helper()
	var fl *faultproxy.Listener
	listen := kfake.ListenFn(func(network, address string) (net.Listener, error) {
		host, port, _ := net.SplitHostPort(address)
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		l, err := net.Listen(network, net.JoinHostPort(host, port))
		if err != nil {
			return nil, err
		}
		fl = faultproxy.Wrap(l)
		return fl, nil
	})
	k, err := devenv.StartFakeKafka(append([]kfake.Opt{listen}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { k.Close() })
	return &testenv.Kafka{Kafka: k}, fl
}

// The first batch's COMMIT never reaches the server; the server session
// stays in its transaction, holding the claims' locks, until its idle
// timeout. The retry on a new connection waits for those locks (lock
// timeouts, retried), then finds the claims free again and applies.
//
// That the session is left holding the claims is the proxy's doing, but
// not wholly in its hands: a statement of the batch's closing round trip
// that fails on the server (a lock wait cut short while the machine
// crawls) aborts the transaction ahead of the missing COMMIT and releases
// its locks (and its idle timeout, set for the transaction only), and the
// retry then meets nothing. The test looks at the
// session itself, and runs the scenario again, up to three times, until
// it holds; only then is the retry's wait required.
func TestCommitSwallowedWithTheSessionLeftOpen(t *testing.T) {
	t.Parallel()
	for run := 1; run <= 3; run++ {
		left, ok := commitSwallowedRun(t)
		if ok {
			return
		}
		t.Logf("run %d: the session left open did not hold the claims (%s); running the scenario again", run, left)
	}
	t.Fatal("in three runs, the session whose COMMIT was swallowed never held the claims: the scenario did not happen")
}

// commitSwallowedRun runs the scenario once. It checks that every message
// was applied once whatever became of the session left open, and, when
// that session held the claims, that the retry waited for them. ok is
// false when it did not hold them; left then says what it was doing.
func commitSwallowedRun(t *testing.T) (left leftOpenSession, ok bool) {
	e := setup(t, 1)
	proxy, err := faultproxy.Start(e.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })

	errs := &batchErrors{}
	cfg := e.config(e.applyHandler())
	cfg.IdleInTransactionTimeout = 2 * time.Second
	cfg.HandlerTimeout = time.Second
	cfg.LockTimeout = 300 * time.Millisecond
	cfg.Hooks = append(cfg.Hooks, errs, swallowOnFirstBatch{proxy: proxy, once: &sync.Once{}})
	c, err := consumer.New(e.db.PoolVia(t, proxy.Addr()), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.waitRecorded() // its COMMIT is not the one to swallow
	ids := e.produceIDs("w", 40)
	waitFor(t, 30*time.Second, "a COMMIT to be swallowed", func() bool { return proxy.Swallowed() > 0 })
	left = sessionLeftOpen(t, e.db, proxy.SwallowedFrom(), e.db.Table("processed_messages"))
	if left.found && !left.heldClaims() {
		// The transaction aborted ahead of the missing COMMIT, and with it
		// went its SET LOCAL idle timeout: the session the proxy keeps
		// would stay idle in its aborted transaction for good. End it, so
		// that the checks below see only what the consumer left.
		e.db.Exec(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_port = $1`, proxy.SwallowedFrom())
	}
	e.waitCommitted(map[int]int64{0: 40}, 60*time.Second)
	cancel()
	require.NoError(t, <-done)

	require.EqualValues(t, 1, proxy.Swallowed())
	require.Equal(t, 1, errs.containing("commit outcome unknown"))
	e.check(expectation{ids: ids})
	if !left.heldClaims() {
		return left, false
	}
	require.Positive(t, errs.containing("lock timeout"), "the retry waited on the abandoned session's locks")
	return left, true
}

// leftOpenSession is what pg_stat_activity and pg_locks showed of a
// server session whose COMMIT was swallowed, once it had run what came
// before the COMMIT.
type leftOpenSession struct {
	found       bool
	state       string
	query       string
	claimsLocks int64 // locks it held on processed_messages
}

func (s leftOpenSession) heldClaims() bool {
	return s.found && s.state == "idle in transaction" && s.claimsLocks > 0
}

func (s leftOpenSession) String() string {
	if !s.found {
		return "it was gone"
	}
	return fmt.Sprintf("state %q, %d locks on processed_messages, last statement %q", s.state, s.claimsLocks, s.query)
}

// sessionLeftOpen finds the server session whose client is the proxy's
// connection from clientPort, and waits until it is done with what it was
// sent (at most 10 s).
func sessionLeftOpen(t *testing.T, db *testenv.DB, clientPort int, claimsTable string) leftOpenSession {
	t.Helper()
	var s leftOpenSession
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := db.Pool.QueryRow(context.Background(), `SELECT a.state, a.query,
  (SELECT count(*) FROM pg_locks l WHERE l.pid = a.pid AND l.granted AND l.relation = $2::regclass)
FROM pg_stat_activity a WHERE a.client_port = $1`, clientPort, claimsTable).Scan(&s.state, &s.query, &s.claimsLocks)
		if errors.Is(err, pgx.ErrNoRows) {
			return leftOpenSession{}
		}
		require.NoError(t, err)
		s.found = true
		if s.state != "active" || time.Now().After(deadline) {
			return s
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type swallowOnFirstBatch struct {
	proxy *faultproxy.Proxy
	once  *sync.Once
}

func (s swallowOnFirstBatch) OnBatchStart(context.Context, consumer.BatchInfo) {
	s.once.Do(func() { s.proxy.SwallowCommits(1) })
}

func TestPostgresRestartMidRun(t *testing.T) {
	t.Parallel()
	cluster, err := pgcluster.Start(context.Background(), nil)
	if errors.Is(err, pgcluster.ErrNoBinaries) {
		t.Skip("needs the PostgreSQL server binaries to restart a server of its own")
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	cfg, err := pgxpool.ParseConfig(cluster.URL())
	require.NoError(t, err)
	name := testenv.Name(t, "t")
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, err = pool.Exec(context.Background(), `CREATE SCHEMA `+name)
	require.NoError(t, err)
	_, err = schema.Migrate(context.Background(), pool, name)
	require.NoError(t, err)

	k := testenv.NewKafka(t)
	db := &testenv.DB{Pool: pool, Schema: name, URL: cluster.URL()}
	e := &env{t: t, db: db, kafka: k, topic: k.Topic(t, 3), parts: 3, group: k.Group(t), name: "ledger", events: &recorder{}}
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL, topic text NOT NULL, partition int NOT NULL, kafka_offset bigint NOT NULL, value text NOT NULL)`)
	e.watchCommits()

	ids := e.produceIDs("r", 3000)
	slow := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		time.Sleep(200 * time.Microsecond)
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfgC := e.config(slow)
	cfgC.MaxBatch = 50
	r := e.start(cfgC)
	waitFor(t, 30*time.Second, "some progress", func() bool { return e.effectsOr0() >= 500 })
	// pg_ctl stop -m immediate, then start. The throwaway server runs with
	// synchronous_commit off, so the crash also loses its last committed
	// transactions, whose offsets may already be in Kafka: the consumer
	// must process those messages again.
	require.NoError(t, cluster.Restart(context.Background()))
	e.waitCommitted(map[int]int64{0: 1000, 1: 1000, 2: 1000}, 90*time.Second)
	r.stop()
	e.check(expectation{ids: ids})
}

// effectsOr0 counts effects, 0 while the database is unreachable.
func (e *env) effectsOr0() int64 {
	var n int64
	_ = e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.db.Table("effects")).Scan(&n)
	return n
}

// A member frozen past its session, its transaction open, is fenced: the
// group gives its partitions to another member, and once it wakes its
// offset commits are refused (its generation, or under the consumer
// protocol its epoch, is over) and its claims are found taken.
func TestZombieMemberCannotCommitOffsets(t *testing.T) {
	t.Parallel()
	eachProtocol(t, func(t *testing.T, proto consumer.GroupProtocol) {
		zombieCannotCommit(t, setupProtocol(t, 2, proto))
	})
}

func zombieCannotCommit(t *testing.T, e *env) {
	ids := e.produceIDs("z", 600)
	spec := childSpec{DatabaseURL: e.db.AppURL(), Schema: e.db.Schema, Brokers: e.kafka.Brokers, Topic: e.topic, Group: e.group, Name: e.name,
		Serve: true, Slow: 5 * time.Millisecond, IdleInTransaction: 3 * time.Second, Protocol: e.protocol}
	type result struct {
		killed bool
		out    string
	}
	childDone := make(chan result, 1)
	pid := make(chan int, 1)
	go func() {
		k, out := e.runChildPID(spec, 2*time.Minute, pid)
		childDone <- result{k, out}
	}()
	zombie := <-pid
	waitFor(t, 30*time.Second, "the child applying", func() bool { return e.effects() >= 100 })

	// Freeze it past its session timeout: the group evicts it, and this
	// member takes its partitions over, while its transaction is still open.
	require.NoError(t, syscall.Kill(zombie, syscall.SIGSTOP))
	r := e.start(e.config(e.applyHandler()))
	waitFor(t, 90*time.Second, "the new member through the topic", func() bool {
		p := e.storedPositions()
		return p[0] == 300 && p[1] == 300
	})
	// Wake the zombie: its transaction is gone (idle timeout), its batch
	// runs again and finds the claims taken; its offset commits are
	// rejected by the broker.
	require.NoError(t, syscall.Kill(zombie, syscall.SIGCONT))
	time.Sleep(5 * time.Second)
	require.NoError(t, syscall.Kill(zombie, syscall.SIGTERM))
	res := <-childDone
	r.stop()
	// The zombie's commit does not land: the broker fences it (kfake, and
	// Kafka while the connection lives), or its connection, dead while it
	// was frozen, fails it first (what Apache Kafka 4.1 does here). The
	// checker then proves no offset moved back and nothing applied twice.
	// Or the zombie was frozen mid-transaction, which the server ended at
	// its idle timeout: it had nothing durable to commit offsets for, and
	// its retry met the revocation first. Or it was frozen inside a
	// handler call: on waking, the call's HandlerTimeout has long passed
	// (the clock ran while it was stopped), the attempt is abandoned with
	// its connection, and it commits nothing either.
	fenced := strings.Contains(res.out, "generation has ended")
	failed := strings.Contains(res.out, "kafka offset commit failed")
	killed := strings.Contains(res.out, "idle-in-transaction timeout")
	abandoned := strings.Contains(res.out, "exceeded HandlerTimeout")
	require.True(t, fenced || failed || killed || abandoned, "the zombie's offset commit was rejected:\n%s", tail(res.out, 3000))
	e.check(expectation{ids: ids})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func TestOffsetCommitErrorsAndLostReplies(t *testing.T) {
	t.Parallel()
	k, _ := faultyKafka(t, kfake.SeedTopics(1))
	e := setupOn(t, 1, k)
	var injected atomic.Int32
	k.Fake.ControlKey(kmsg.OffsetCommit.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.OffsetCommitRequest)
		if req.Generation < 0 || injected.Load() >= 4 {
			return nil, nil, false
		}
		k.Fake.KeepControl() // handling a request would otherwise drop this function
		switch n := injected.Add(1); {
		case n <= 2: // the coordinator answers with an error
			resp := req.ResponseKind().(*kmsg.OffsetCommitResponse)
			for _, rt := range req.Topics {
				st := kmsg.NewOffsetCommitResponseTopic()
				st.Topic, st.TopicID = rt.Topic, rt.TopicID
				for _, rp := range rt.Partitions {
					sp := kmsg.NewOffsetCommitResponseTopicPartition()
					sp.Partition = rp.Partition
					sp.ErrorCode = 15 // COORDINATOR_NOT_AVAILABLE
					st.Partitions = append(st.Partitions, sp)
				}
				resp.Topics = append(resp.Topics, st)
			}
			return resp, nil, true
		default: // the request vanishes with the connection
			return nil, errors.New("connection lost"), true
		}
	})
	ids := e.produceIDs("o", 200)
	cfg := e.config(e.applyHandler())
	cfg.MaxBatch = 20
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 200}, 60*time.Second)
	r.stop()
	require.EqualValues(t, 4, injected.Load(), "two error answers and two lost connections were injected (commit errors seen: %v)", e.events.snapshot().commitErr)
	if kafkaClient() == consumer.KafkaGo {
		// franz-go retries a commit that failed so within the commit.
		require.NotEmpty(t, e.events.snapshot().commitErr, "the failed commits were reported")
	}
	e.check(expectation{ids: ids})
}

func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	start := func() *devenv.Kafka {
		var k *devenv.Kafka
		deadline := time.Now().Add(10 * time.Second)
		for {
			k, err = devenv.StartFakeKafka(kfake.DataDir(dir), kfake.Ports(port), kfake.SeedTopics(2, "restart-topic"))
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond) // the old listener may linger
		}
		require.NoError(t, err)
		return k
	}
	k := &testenv.Kafka{Kafka: start()}
	e := setupOn(t, 2, k)
	e.topic = "restart-topic"
	ids := e.produceIDs("b", 2000)
	slow := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		time.Sleep(300 * time.Microsecond)
		return e.applyHandler().Handle(ctx, tx, m)
	})
	r := e.start(e.config(slow))
	waitFor(t, 30*time.Second, "some progress", func() bool { return e.effects() >= 300 })
	k.Close() // the broker goes away...
	time.Sleep(2 * time.Second)
	k.Kafka = start() // ...and comes back with its data
	t.Cleanup(func() { k.Close() })
	e.waitCommitted(map[int]int64{0: 1000, 1: 1000}, 120*time.Second)
	r.stop()
	e.commits = nil // the new broker instance has no watch
	e.check(expectation{ids: ids})
}

func TestFailingDeadLetterWrite(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	// The first three dead-letter writes fail: the batch must run again,
	// neither losing the poison nor applying anything twice.
	// A sequence counts the attempts: unlike a table, it is not rolled
	// back with the failed transactions.
	e.db.Exec(t, `CREATE SEQUENCE `+e.db.Table("dl_attempts"))
	e.db.Exec(t, `CREATE FUNCTION `+e.db.Table("fail_dl")+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval('`+e.db.Schema+`.dl_attempts') <= 3 THEN RAISE EXCEPTION 'dead-letter storage unavailable'; END IF;
  RETURN NEW;
END $$`)
	e.db.Exec(t, `CREATE TRIGGER fail_dl BEFORE INSERT ON `+e.db.Table("dead_letters")+` FOR EACH ROW EXECUTE FUNCTION `+e.db.Table("fail_dl")+`()`)
	ids := e.produceIDs("f", 50)
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "f-17" || m.ID == "f-33" {
			return consumer.Permanent(errors.New("poison"))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	e.waitCommitted(map[int]int64{0: 50}, 60*time.Second)
	r.stop()
	require.Greater(t, e.db.Int(t, `SELECT last_value FROM `+e.db.Table("dl_attempts")), int64(3), "the failures were injected")
	e.check(expectation{ids: ids, poison: []string{"f-17", "f-33"}})
}

func TestSIGTERMMidBatch(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	ids := e.produceIDs("s", 1000)
	spec := childSpec{DatabaseURL: e.db.AppURL(), Schema: e.db.Schema, Brokers: e.kafka.Brokers, Topic: e.topic, Group: e.group, Name: e.name,
		Serve: true, Slow: 2 * time.Millisecond}
	done := make(chan string, 1)
	pid := make(chan int, 1)
	var killed atomic.Bool
	go func() {
		k, out := e.runChildPID(spec, 2*time.Minute, pid)
		killed.Store(k)
		done <- out
	}()
	child := <-pid
	waitFor(t, 30*time.Second, "batches in flight", func() bool { return e.effects() >= 200 })
	require.NoError(t, syscall.Kill(child, syscall.SIGTERM))
	out := <-done
	require.False(t, killed.Load())
	require.Contains(t, out, "consumer stopped", "the child drained and stopped:\n%s", tail(out, 2000))

	r := e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: 500, 1: 500}, 60*time.Second)
	r.stop()
	e.check(expectation{ids: ids})
}

func TestLatencyAndCutConnections(t *testing.T) {
	t.Parallel()
	k, kl := faultyKafka(t, kfake.SeedTopics(4))
	e := setupOn(t, 4, k)
	proxy, err := faultproxy.Start(e.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	proxy.SetLatency(2 * time.Millisecond)
	kl.SetLatency(2 * time.Millisecond)
	ids := e.produceIDs("l", 4000)

	cfg := e.config(e.applyHandler())
	cfg.MaxBatch = 200
	c, err := consumer.New(e.db.PoolVia(t, proxy.Addr(), testenv.MaxConns(12)), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for i := 0; i < 8; i++ {
		time.Sleep(400 * time.Millisecond)
		if i%2 == 0 {
			proxy.CutAll()
		} else {
			kl.CutAll()
		}
	}
	proxy.SetLatency(0)
	kl.SetLatency(0)
	e.waitCommitted(map[int]int64{0: 1000, 1: 1000, 2: 1000, 3: 1000}, 120*time.Second)
	cancel()
	require.NoError(t, <-done)
	require.EqualValues(t, 4, kl.Cuts())
	e.check(expectation{ids: ids})
}

func TestMessagesLargerThanTheFetchSize(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	big := strings.Repeat("x", 200<<10) // 200 KiB
	var msgs []kafka.Message
	var ids []string
	for i := range 20 {
		id := "big-" + strconv.Itoa(i)
		ids = append(ids, id)
		v := "small"
		if i%3 == 0 {
			v = big
		}
		msgs = append(msgs, msg(0, id, v))
	}
	e.kafka.Produce(t, e.topic, msgs...)
	cfg := e.config(e.applyHandler())
	cfg.FetchMaxBytes = 64 << 10 // smaller than a big message: the broker still returns it alone
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 20}, 60*time.Second)
	r.stop()
	e.check(expectation{ids: ids})
	require.EqualValues(t, 7*len(big), e.db.Int(t, `SELECT sum(length(value)) FROM `+e.db.Table("effects")+` WHERE value <> 'small'`))
}

// A partition's stored position can vanish mid-run with everything its
// transactions wrote (asynchronous commit, a failover to a lagging
// replica, a restore that lost the partition's first transactions). The
// worker must notice once, start again from where its run started, and
// apply everything once more — not report the loss on every batch until
// the next rebalance.
func TestAPositionLostWithItsRowIsRecoveredOnce(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		ids := e.produceIDs("p", 5)
		cfg := e.config(e.applyHandler())
		if batched {
			cfg = batchConfig(e, &batchEffects{e: e})
		}
		r := e.start(cfg)
		waitFor(t, 30*time.Second, "the first messages", func() bool { return e.storedPositions()[0] == 5 })
		// Their offset commit is on its way after the database's COMMIT;
		// landing after the loss below, it would be judged against a row
		// the test, not the consumer, removed.
		e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
		// Everything the partition's transactions wrote, lost at once.
		e.db.Exec(t, `DELETE FROM `+e.db.Table("consumer_offsets"))
		e.db.Exec(t, `DELETE FROM `+e.db.Table("processed_messages"))
		e.db.Exec(t, `DELETE FROM `+e.db.Table("effects"))
		more := make([]kafka.Message, 5)
		for i := range more {
			id := fmt.Sprintf("p-%d", 5+i)
			ids = append(ids, id)
			more[i] = msg(0, id, "v-"+id)
		}
		e.kafka.Produce(t, e.topic, more...)
		e.waitEffects(10, 15*time.Second)
		waitFor(t, 15*time.Second, "the position back", func() bool { return e.storedPositions()[0] == 10 })
		r.stop()
		e.check(expectation{ids: ids})
	})
}

// A session the server ends under a running handler (an operator's
// pg_terminate_backend, a restart, a failover) is the database's failure:
// the batch runs again; it is no handler ending its transaction.
func TestASessionTerminatedUnderAHandlerIsRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		later bool // the second batch: its statements are prepared on the connection already
	}{
		{name: "first batch on the connection"},
		{name: "a later batch", later: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			ids := e.produceIDs("k", 5)
			victim := "k-4" // the last message of the batch: the closing round trip comes next
			if tc.later {
				victim = "l-4"
			}
			var killed atomic.Bool
			apply := e.applyHandler()
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if err := apply.Handle(ctx, tx, m); err != nil {
					return err
				}
				if m.ID == victim && killed.CompareAndSwap(false, true) {
					// An operator (or a restart) terminates the session
					// while the handler works on something else.
					var pid int32
					if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
						return err
					}
					if _, err := e.db.Pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
						return err
					}
					for e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid) != 0 {
						time.Sleep(10 * time.Millisecond)
					}
				}
				return nil
			})
			r := e.start(e.config(h))
			end := int64(5)
			if tc.later {
				e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
				ids = append(ids, e.produceIDs("l", 5)...)
				end = 10
			}
			waitFor(t, 30*time.Second, "the batch to be committed or the partition to stop", func() bool {
				return len(e.events.snapshot().stopped) > 0 || e.kafka.CommittedOffsets(t, e.group, e.topic, 1)[0] == end
			})
			r.stop()
			require.True(t, killed.Load())
			var msgs []string
			for _, s := range e.events.snapshot().stopped {
				msgs = append(msgs, s.Error())
			}
			require.Empty(t, msgs, "a terminated session stopped the partition")
			e.check(expectation{ids: ids})
		})
	}
}

// A network error is the database's failure only when it broke the
// transaction's own connection. When the network to Postgres fails under
// a handler's query, the batch runs again, however often, counting no
// attempt and setting nothing aside: whether the handler returns the
// error or swallows it, and in a BatchHandler's call over several
// messages, where the failure is no one message's. When a handler's own
// network call fails (a partner that is down), the message fails: it is
// retried up to MaxAttempts and set aside, as any failure of the handler's,
// though its error is a net.Error too.
func TestANetworkErrorIsTheDatabasesOnlyWhenItBrokeTheTransaction(t *testing.T) {
	t.Parallel()
	const (
		victim      = "n-2"
		maxAttempts = 3
		cuts        = 2 * maxAttempts // times the network to Postgres fails under the victim
	)
	for _, tc := range []struct {
		name    string
		batch   bool // a BatchHandler, called with the whole batch
		partner bool // the handler's own call fails; the database is fine
		swallow bool // the handler returns nil after its query failed
	}{
		{name: "database/Handler returns the error"},
		{name: "database/Handler swallows the error", swallow: true},
		{name: "database/BatchHandler over several messages", batch: true},
		{name: "partner/Handler", partner: true},
		{name: "partner/BatchHandler over several messages", batch: true, partner: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			proxy, err := faultproxy.Start(e.db.ServerAddr(t))
			require.NoError(t, err)
			t.Cleanup(func() { proxy.Close() })
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			partner := "http://" + ln.Addr().String() + "/"
			require.NoError(t, ln.Close()) // nothing listens there: the partner is down
			ids := e.produceIDs("n", 5)

			var calls atomic.Int32 // of the handler with the victim
			// fail is what the handler does with the victim before it may
			// pass: failed is false once it may.
			fail := func(ctx context.Context, tx pgx.Tx) (failed bool, err error) {
				if tc.partner {
					req, err := http.NewRequestWithContext(ctx, http.MethodGet, partner, nil)
					if err != nil {
						return true, err
					}
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						return true, fmt.Errorf("call partner: %w", err)
					}
					resp.Body.Close()
					return true, errors.New("the partner answered")
				}
				if calls.Load() > cuts {
					return false, nil
				}
				proxy.CutAll()
				_, err = tx.Exec(ctx, `SELECT 1`)
				switch {
				case err == nil:
					return true, errors.New("a query went through a cut connection") // counts, and fails the test
				case tc.swallow:
					return true, nil
				}
				return true, fmt.Errorf("record the order: %w", err)
			}
			apply := e.applyHandler()
			cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == victim {
					calls.Add(1)
					if failed, err := fail(ctx, tx); failed {
						return err
					}
				}
				return apply.Handle(ctx, tx, m)
			}))
			if tc.batch {
				h := cfg.Handler
				cfg.Handler, cfg.ClaimFirst = nil, true
				cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
					for _, m := range b.Messages {
						if err := h.Handle(ctx, b.Tx, m); err != nil {
							return err
						}
					}
					return nil
				})
			}
			cfg.Retry.MaxAttempts = maxAttempts
			r := e.start(cfg, e.db.PoolVia(t, proxy.Addr()))
			e.waitCommitted(map[int]int64{0: 5}, 60*time.Second)
			r.stop()
			if tc.partner {
				l, ok := e.letters()[victim]
				require.True(t, ok, "the victim of a partner that is down was set aside")
				require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
				require.Equal(t, maxAttempts, l.Attempts)
				e.check(expectation{ids: ids, poison: []string{victim}})
				return
			}
			require.Greater(t, calls.Load(), int32(cuts), "the network failed under the victim's handler %d times", cuts)
			e.check(expectation{ids: ids})
		})
	}
}

// An error that is the database's, whatever statement of the handler's
// raised it (a full disk under an INSERT, the server shutting down, an
// I/O error, a corrupted index), never sets a message aside: the
// transaction runs again, counting no attempt, until the database is
// back. Each code is raised by the server itself, from the handler's
// statement (RAISE … USING ERRCODE), more often than MaxAttempts allows:
// were one counted, the message would be set aside. Codes of the
// handler's still count: a cancelled statement (StatementTimeout's), a
// statement past temp_file_limit, a database or login a statement names,
// and a read-only transaction met after the batch wrote (only the
// handler can have made it so).
func TestTheDatabasesErrorsUnderAHandlerNeverSetAMessageAside(t *testing.T) {
	t.Parallel()
	const maxAttempts = 2
	raise := func(code string) string {
		return `DO $$ BEGIN RAISE EXCEPTION 'the database fails' USING ERRCODE = '` + code + `'; END $$`
	}
	for _, tc := range []struct {
		code   string
		batch  bool // queued by a BatchHandler rather than sent by a Handler
		counts bool // the handler's: the victim is set aside
	}{
		{code: "53100"}, // disk_full
		{code: "53200"}, // out_of_memory
		{code: "53100", batch: true},
		{code: "57P01"}, // admin_shutdown
		{code: "58030"}, // io_error
		{code: "XX001"}, // data_corrupted
		{code: "40003"}, // statement_completion_unknown
		{code: "57014", counts: true},
		{code: "57014", batch: true, counts: true},
		{code: "53400", counts: true},
		{code: "3D000", counts: true},
		{code: "28P01", counts: true},
		{code: "25006", counts: true},
	} {
		name := tc.code
		if tc.batch {
			name += "/BatchHandler"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			ids := e.produceIDs("d", 4)
			const victim = "d-2"
			var fails atomic.Int32
			failing := func(m *consumer.Message) bool {
				return m.ID == victim && fails.Add(1) <= 3*maxAttempts
			}
			apply := e.applyHandler()
			cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if failing(m) {
					if _, err := tx.Exec(ctx, raise(tc.code)); err != nil {
						return fmt.Errorf("record the order: %w", err)
					}
				}
				return apply.Handle(ctx, tx, m)
			}))
			if tc.batch {
				insert := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
				cfg.Handler = nil
				cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
					for _, m := range b.Messages {
						if failing(m) {
							b.Queue(raise(tc.code))
						}
						b.Queue(insert, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
					}
					return nil
				})
			}
			cfg.Retry.MaxAttempts = maxAttempts
			r := e.start(cfg)
			e.waitCommitted(map[int]int64{0: 4}, 60*time.Second)
			r.stop()
			if tc.counts {
				l, ok := e.letters()[victim]
				require.True(t, ok, "a statement cancelled counts: the victim is set aside")
				require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
				e.check(expectation{ids: ids, poison: []string{victim}})
				return
			}
			require.Greater(t, fails.Load(), int32(maxAttempts), "the database failed under the victim more often than MaxAttempts")
			require.Empty(t, e.letters(), "the database's errors set a message aside")
			e.check(expectation{ids: ids})
		})
	}
}

// A backend that stops answering (hung on its storage, or stopped, its
// TCP connection up) holds neither a shutdown nor the partition: the
// consumer's own ROLLBACK is bounded, and a connection that does not
// answer it is closed under it (the server rolls back when it notices).
// At shutdown, Run returns within ShutdownTimeout and that bound, and
// nothing of the batch it gave up on is kept; after a failed attempt, the
// partition goes on and applies the message once.
func TestABackendThatDoesNotAnswerTheRollbackHoldsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		shutdown bool // the rollback is the shutdown's; else a failed attempt's
	}{
		{name: "at shutdown", shutdown: true},
		{name: "after a failed attempt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			proxy, err := faultproxy.Start(e.db.ServerAddr(t))
			require.NoError(t, err)
			t.Cleanup(func() { proxy.Close() })
			ids := e.produceIDs("s", 4)
			const victim = "s-2"
			entered := make(chan struct{})
			var once sync.Once
			apply := e.applyHandler()
			cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if err := apply.Handle(ctx, tx, m); err != nil {
					return err
				}
				failed := false
				if m.ID == victim {
					once.Do(func() {
						// The server stops answering from the ROLLBACK on.
						proxy.StallRollbacks(1)
						close(entered)
						failed = true
					})
				}
				switch {
				case !failed:
					return nil
				case tc.shutdown:
					<-ctx.Done() // until the shutdown gives up on the batch
					return ctx.Err()
				}
				return errors.New("partner down, once")
			}))
			cfg.ShutdownTimeout = time.Second
			r := e.start(cfg, e.db.PoolVia(t, proxy.Addr()))
			<-entered
			if tc.shutdown {
				r.stop() // fails the test if Run does not return within 30 s
				require.EqualValues(t, 1, proxy.Stalled(), "the ROLLBACK was stalled")
				require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id = $1`, victim), "the given-up batch kept nothing")
				r = e.start(e.config(apply))
			}
			e.waitCommitted(map[int]int64{0: 4}, 60*time.Second)
			r.stop()
			require.EqualValues(t, 1, proxy.Stalled(), "the ROLLBACK was stalled")
			e.check(expectation{ids: ids})
		})
	}
}

// docs/guarantee.md, "Contention is never a message's failure": a lock wait
// rolls back and runs again "without counting an attempt and without
// setting anything aside"; docs/failures.md: "A row that another session
// keeps locked blocks the messages that need it for as long as it stays
// locked, as an outage would, and never sets them aside".
//
// New accepts a HandlerTimeout shorter than LockTimeout (it refuses only
// an IdleInTransactionTimeout that is not longer). A handler waiting on a
// row lock must still have its wait end as contention, never as ErrTimeout
// (an attempt of the message's): otherwise, after MaxAttempts, the message
// would be set aside as retries_exhausted because another session held a
// row for a few seconds.
func TestALockWaitLongerThanHandlerTimeoutSetsNothingAside(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ctx := context.Background()
	e.db.Exec(t, `CREATE TABLE `+e.db.Table("hot")+` (id int PRIMARY KEY, n int NOT NULL)`)
	e.db.Exec(t, `INSERT INTO `+e.db.Table("hot")+` VALUES (1, 0)`)
	hold, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `UPDATE `+e.db.Table("hot")+` SET n = n WHERE id = 1`)
	require.NoError(t, err)

	ids := e.produceIDs("h", 3)
	apply := e.applyHandler()
	var waited atomic.Int64 // time spent in lock waits that ended without the row
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		began := time.Now()
		if _, err := tx.Exec(ctx, `UPDATE `+e.db.Table("hot")+` SET n = n + 1 WHERE id = 1`); err != nil {
			waited.Add(int64(time.Since(began)))
			return err
		}
		return apply.Handle(ctx, tx, m)
	}))
	cfg.HandlerTimeout = time.Second // LockTimeout stays at its default, 10s
	cfg.Retry.MaxAttempts = 2
	r := e.start(cfg)
	// The row stays held until the handlers have waited for it longer than
	// MaxAttempts calls cut off by HandlerTimeout would have: had those
	// waits counted, the message would be set aside by then.
	waitFor(t, 60*time.Second, "longer waits for the held row than MaxAttempts handler timeouts", func() bool {
		return time.Duration(waited.Load()) > time.Duration(cfg.Retry.MaxAttempts+1)*cfg.HandlerTimeout
	})
	require.NoError(t, hold.Rollback(ctx))
	e.waitCommitted(map[int]int64{0: 3}, 60*time.Second)
	r.stop()
	if ls := e.letters(); len(ls) > 0 {
		for id, l := range ls {
			t.Errorf("message %s set aside (class %s, %d attempts) while another session held a row it needs: %s", id, l.Class, l.Attempts, l.Error)
		}
		t.FailNow()
	}
	e.check(expectation{ids: ids})
}

// failuresSeen counts the failed attempts the failure hook reports.
type failuresSeen struct{ n atomic.Int32 }

func (f *failuresSeen) OnMessageFailed(context.Context, *consumer.Message, consumer.Failure) {
	f.n.Add(1)
}

// The database failing at COMMIT, not under a handler's statement: a
// deferred constraint trigger of the handler's table raises the
// database's errors (or terminates its own backend, a real FATAL) while
// the server checks it at COMMIT, for the victim's row, a few times. The
// COMMIT is refused, so nothing committed and the outcome is known; what
// refused it is the database, not the message, so the whole transaction
// runs again, counting nothing and setting nothing aside, whichever way
// the batch went (a Handler, a BatchHandler's one round trip, where the
// refused COMMIT drops the attempt, or a BatchHandler claiming first).
// A statement cancelled by the server at COMMIT (statement_timeout hitting
// a slow deferred check) is the handler's, as under a handler: it counts,
// and the victim is set aside once its attempts ran out.
func TestTheDatabasesErrorsAtCommitNeverSetAMessageAside(t *testing.T) {
	t.Parallel()
	const maxAttempts = 2
	for _, tc := range []struct {
		code   string // "" for a real FATAL: the backend terminates itself
		counts bool
	}{
		{code: ""},      // FATAL 57P01 from pg_terminate_backend
		{code: "40001"}, // serialization_failure
		{code: "40P01"}, // deadlock_detected
		{code: "53100"}, // disk_full
		{code: "58030"}, // io_error
		{code: "57014", counts: true},
	} {
		for _, path := range []string{"Handler", "BatchHandler, one round trip", "BatchHandler, ClaimFirst"} {
			name := tc.code
			if name == "" {
				name = "terminated"
			}
			t.Run(name+"/"+path, func(t *testing.T) {
				t.Parallel()
				e := setup(t, 1)
				effects, fails, fn := e.db.Table("effects"), e.db.Table("commit_fails"), e.db.Table("fail_at_commit")
				const victim = "d-2"
				raise := `PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(10);`
				if tc.code != "" {
					raise = `RAISE EXCEPTION 'the database fails at COMMIT' USING ERRCODE = '` + tc.code + `';`
				}
				e.db.Exec(t, `CREATE SEQUENCE `+fails)
				e.db.Exec(t, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.message_id = '`+victim+`' AND nextval('`+fails+`') <= `+strconv.Itoa(3*maxAttempts)+` THEN
		`+raise+`
	END IF;
	RETURN NULL;
END $$`)
				e.db.Exec(t, `CREATE CONSTRAINT TRIGGER fail_at_commit AFTER INSERT ON `+effects+
					` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)
				var cfg *consumer.Config
				switch path {
				case "Handler":
					cfg = e.config(e.applyHandler())
				default:
					cfg = batchConfig(e, queueingBatchHandler(e))
					cfg.ClaimFirst = path == "BatchHandler, ClaimFirst"
				}
				seen := &failuresSeen{}
				errs := &batchErrors{}
				cfg.Hooks = append(cfg.Hooks, seen, errs)
				cfg.Retry.MaxAttempts = maxAttempts
				// A first batch stores a position, so the next may go in
				// one round trip.
				ids := e.produceIDs("w", 1)
				r := e.start(cfg)
				e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
				ids = append(ids, e.produceIDs("d", 4)...)
				e.waitCommitted(map[int]int64{0: 5}, 60*time.Second)
				r.stop()

				require.Empty(t, e.events.snapshot().stopped, "a partition stopped")
				require.Zero(t, errs.containing("outcome unknown"), "a refused COMMIT was taken for an unknown outcome: %v", errs.errs)
				if tc.counts {
					l, ok := e.letters()[victim]
					require.True(t, ok, "a statement cancelled at COMMIT counts: the victim is set aside")
					require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
					e.check(expectation{ids: ids, poison: []string{victim}})
					return
				}
				require.GreaterOrEqual(t, e.db.Int(t, `SELECT last_value FROM `+fails), int64(3*maxAttempts),
					"the database failed at the victim's COMMIT more often than MaxAttempts")
				require.Empty(t, e.letters(), "the database's errors at COMMIT set a message aside")
				require.Zero(t, seen.n.Load(), "the database's errors at COMMIT were counted as the messages' failures")
				e.check(expectation{ids: ids})
			})
		}
	}
}
