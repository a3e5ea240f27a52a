package consumer_test

// Pauses under faults and races: each test states the promise it holds the
// code to, and fails when the code breaks it.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/offsets"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// pauseReadDB is the test's pool, with control over the transactions that
// read the consumer's pauses (pauses.Store.List): the next read can be held
// after it has read the rows and before its transaction ends (a slow
// Postgres), and reads can be made to fail (a Postgres that does not
// answer them).
type pauseReadDB struct {
	*pgxpool.Pool
	mu      sync.Mutex
	hold    bool          // hold the next read that completes
	held    chan struct{} // closed once a read is held
	release chan struct{} // closing it lets the held read finish
	failing atomic.Bool
	reads   atomic.Int64
}

func newPauseReadDB(p *pgxpool.Pool) *pauseReadDB { return &pauseReadDB{Pool: p} }

// holdNext arms the hold of the next read of the pauses.
func (d *pauseReadDB) holdNext() (held, release chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hold, d.held, d.release = true, make(chan struct{}), make(chan struct{})
	return d.held, d.release
}

func (d *pauseReadDB) takeHold() (held, release chan struct{}, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.hold {
		return nil, nil, false
	}
	d.hold = false
	return d.held, d.release, true
}

func (d *pauseReadDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.Pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &pauseReadTx{Tx: tx, db: d}, nil
}

type pauseReadTx struct {
	pgx.Tx
	db     *pauseReadDB
	listed bool
}

func isPauseList(sql string) bool {
	return strings.Contains(sql, "paused_at, paused_by, reason, until FROM")
}

func (t *pauseReadTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if isPauseList(sql) {
		t.db.reads.Add(1)
		if t.db.failing.Load() {
			return nil, errors.New("injected: Postgres does not answer the read of the pauses")
		}
		t.listed = true
	}
	return t.Tx.Query(ctx, sql, args...)
}

// Rollback ends the read-only transaction the pauses are read in; a held
// read waits here, its rows read, before the set is replaced with them.
func (t *pauseReadTx) Rollback(ctx context.Context) error {
	if t.listed {
		if held, release, ok := t.db.takeHold(); ok {
			close(held)
			<-release
		}
	}
	return t.Tx.Rollback(ctx)
}

// TestAPauseOutlivesAStalePoll: Consumer.Pause applies the pause in this
// process at once, and a paused partition fetches nothing until Resume. A
// poll of the pauses that read the table just before Pause's INSERT
// committed, and finishes after Pause's own refresh, must not put the old
// list (no pause) back: the partition stays paused, also while the later
// polls fail.
func TestAPauseOutlivesAStalePoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, 1)
	ids := e.produceIDs("a", 20)
	var calls atomic.Int64
	apply := e.applyHandler()
	watch := &pauseWatch{}
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		calls.Add(1)
		return apply.Handle(ctx, tx, m)
	}))
	cfg.Hooks = append(cfg.Hooks, watch)
	db := newPauseReadDB(e.db.Pool)
	c, err := consumer.New(db, cfg)
	require.NoError(t, err)
	e.run(c)
	e.waitCommitted(map[int]int64{0: 20}, 60*time.Second)

	// The next poll reads the table (no pause yet) and is held before it
	// puts what it read in the set.
	held, release := db.holdNext()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("no poll of the pauses within 10s")
	}
	require.NoError(t, c.Pause(ctx, pauses.All(), "incident"))
	waitFor(t, 10*time.Second, "the partition reported paused", func() bool { return watch.paused(0) })
	// From here on Postgres does not answer reads of the pauses (a failed
	// read leaves the set as it was); then the held poll finishes.
	db.failing.Store(true)
	close(release)

	more := e.produceIDs("b", 10)
	n := calls.Load()
	stillFor(t, 3*time.Second, "the handler ran on a partition paused by a Consumer.Pause that returned nil", func() bool {
		return calls.Load() == n
	})
	db.failing.Store(false)
	require.NoError(t, c.Resume(ctx, pauses.All()))
	e.waitCommitted(map[int]int64{0: 30}, 60*time.Second)
	e.check(expectation{ids: append(ids, more...)})
}

// TestAPauseKeepsAttemptCounts: failures.md says a pause stops the
// wait between the retries of a failing message, which is tried again
// after the resume, "its attempts so far stay counted", and a message whose
// retries ran out is set aside after Retry.MaxAttempts attempts. Here the
// handler always fails; the partition is paused during each wait between
// retries and resumed. The message must be set aside having been attempted
// MaxAttempts times, however many pauses there were.
func TestAPauseKeepsAttemptCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const maxAttempts = 3
	var calls atomic.Int64
	var s *pauseSetup
	s = newPauseSetup(t, 1, 1, consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		calls.Add(1)
		return errors.New("partner down")
	}), func(cfg *consumer.Config) {
		// Waits long enough for the test to pause in each of them.
		cfg.Retry = consumer.RetryPolicy{InitialInterval: 2 * time.Second, MaxInterval: 2 * time.Second, MaxAttempts: maxAttempts, MaxElapsed: time.Hour}
	})
	s.run()
	letters := func() int64 {
		return s.db.Int(t, `SELECT count(*) FROM `+s.db.Table("dead_letters")+` WHERE consumer = $1`, s.name)
	}
	for i := 1; i <= 2*maxAttempts && letters() == 0; i++ {
		waitFor(t, 30*time.Second, "the next failed attempt", func() bool { return calls.Load() >= int64(i) || letters() > 0 })
		if letters() > 0 {
			break
		}
		require.NoError(t, s.c.Pause(ctx, pauses.All(), "partner down"))
		waitFor(t, 10*time.Second, "the partition reported paused", func() bool { return s.watch.paused(0) })
		require.NoError(t, s.c.Resume(ctx, pauses.All()))
	}
	waitFor(t, 60*time.Second, "the message set aside", func() bool { return letters() == 1 })
	require.EqualValues(t, maxAttempts, calls.Load(),
		"handler calls of a message with Retry.MaxAttempts %d before it was set aside (attempts counted in message_attempts were lost to the pauses)", maxAttempts)
}

// gate blocks the first call that reaches it until released.
type gate struct {
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{reached: make(chan struct{}), release: make(chan struct{})} }

// pass blocks the first time (block false: only signals).
func (g *gate) pass(block bool) {
	first := false
	g.once.Do(func() { first = true; close(g.reached) })
	if first && block {
		<-g.release
	}
}

// TestAPauseAtEveryPointOfABatch: a pause arriving anywhere in a
// batch, then a resume, leaves every message applied once (or set aside,
// for the poison one), none skipped, the offsets never ahead of the
// database, and nothing open while paused.
func TestAPauseAtEveryPointOfABatch(t *testing.T) {
	t.Parallel()
	const total, at = 60, "p-25"
	type point struct {
		name string
		// careful starts the partition one message at a time (the previous
		// run did not get past offset 0).
		careful, batch, claimFirst, poison bool
		// failures is how many times the message at fails (transient)
		// before it passes; the pause comes during the wait after the
		// first.
		failures int
		at       string
	}
	for _, p := range []point{
		{name: "during a handler call", at: at},
		{name: "during a one-trip BatchHandler call", batch: true, at: at},
		{name: "during a claim-first BatchHandler call", batch: true, claimFirst: true, at: at},
		{name: "during a wait between retries", failures: 2, at: at},
		{name: "while the message is set aside", poison: true, at: at},
		{name: "during a handler call in careful mode", careful: true, at: "p-5"},
		{name: "during a retry wait in careful mode", careful: true, failures: 2, at: "p-5"},
	} {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := setup(t, 1)
			ids := e.produceIDs("p", total)
			g := newGate()
			var fails atomic.Int64
			apply := e.applyHandler()
			var cfg *consumer.Config
			if p.batch {
				cfg = batchConfig(e, &batchEffects{e: e, before: func(ms []*consumer.Message) error {
					for _, m := range ms {
						if m.ID == p.at {
							g.pass(true)
						}
					}
					return nil
				}})
				cfg.ClaimFirst = p.claimFirst
			} else {
				cfg = e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if m.ID == p.at {
						switch {
						case p.poison:
							g.pass(true)
							return consumer.Permanent(errors.New("poison"))
						case p.failures > 0 && fails.Load() < int64(p.failures):
							fails.Add(1)
							g.pass(false)
							return errors.New("downstream down")
						case p.failures == 0:
							g.pass(true)
						}
					}
					return apply.Handle(ctx, tx, m)
				}))
			}
			cfg.MaxBatch = 10
			if p.failures > 0 {
				cfg.Retry = consumer.RetryPolicy{InitialInterval: time.Second, MaxInterval: time.Second, MaxAttempts: 10, MaxElapsed: time.Hour}
			}
			watch := &pauseWatch{}
			cfg.Hooks = append(cfg.Hooks, watch)
			if p.careful {
				e.db.Exec(t, `INSERT INTO `+e.db.Table("partition_runs")+` (consumer, topic, partition, start_offset, starts) VALUES ($1, $2, 0, 0, 1)`, e.name, e.topic)
			}
			c, err := consumer.New(e.db.Pool, cfg)
			require.NoError(t, err)
			defer e.run(c).stop()
			select {
			case <-g.reached:
			case <-time.After(60 * time.Second):
				t.Fatal("the message was not reached")
			}
			require.NoError(t, c.Pause(ctx, pauses.All(), "now"))
			close(g.release)
			waitFor(t, 30*time.Second, "the partition reported paused", func() bool { return watch.paused(0) })
			before := e.effects()
			stillFor(t, 500*time.Millisecond, "applied or held a transaction while paused", func() bool {
				return e.effects() == before && e.db.SessionsStuck(t, "idle in transaction%", 250*time.Millisecond) == 0
			})
			require.NoError(t, c.Resume(ctx, pauses.All()))
			e.waitCommitted(map[int]int64{0: total}, 60*time.Second)
			exp := expectation{ids: ids}
			if p.poison {
				exp.poison = []string{p.at}
			}
			e.check(exp)
		})
	}
}

// TestPausesFlappingLoseNothing: pauses and resumes many times a second (in this
// process at once, and through the table from "another process") while
// messages arrive lose or duplicate nothing, commit no offset ahead of the
// database, and leak no goroutine (goleak runs after the package).
func TestPausesFlappingLoseNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, 4)
	ids := e.produceIDs("f0", 400)
	apply := e.applyHandler()
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		time.Sleep(200 * time.Microsecond)
		return apply.Handle(ctx, tx, m)
	}))
	cfg.MaxBatch = 20
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	defer e.run(c).stop()
	store, err := pauses.NewStore(e.db.Schema)
	require.NoError(t, err)

	stop := make(chan struct{})
	var flaps atomic.Int64
	var wg sync.WaitGroup
	scopes := []pauses.Scope{pauses.All(), pauses.Topic(e.topic), pauses.Partition(e.topic, 1)}
	for i, scope := range scopes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if i == 2 {
					// Another process: only the poll tells the consumer.
					_, err := store.Pause(ctx, e.db.Pool, e.name, scope, "ops", "flap")
					require.NoError(t, err)
					time.Sleep(time.Duration(300+i*100) * time.Millisecond)
					_, err = store.Resume(ctx, e.db.Pool, e.name, scope)
					require.NoError(t, err)
				} else {
					require.NoError(t, c.Pause(ctx, scope, "flap"))
					time.Sleep(time.Duration(3+i*4) * time.Millisecond)
					require.NoError(t, c.Resume(ctx, scope))
				}
				flaps.Add(1)
				time.Sleep(time.Duration(5+i*3) * time.Millisecond)
			}
		}()
	}
	for round := 1; round <= 4; round++ {
		waitFor(t, 120*time.Second, "progress under flapping", func() bool { return e.distinctEffects() >= int64(len(ids))/2 })
		ids = append(ids, e.produceIDs("f"+string(rune('0'+round)), 400)...)
	}
	// Progress under flapping is what the rounds show; the rest is
	// processed once the flapping stops (against a real broker, a
	// partition resumed for a few milliseconds at a time may not get a
	// fetch in before the next pause), and then nothing may be missing or
	// applied twice.
	close(stop)
	wg.Wait()
	t.Logf("%d pauses and resumes", flaps.Load())
	for _, scope := range scopes {
		require.NoError(t, c.Resume(ctx, scope))
	}
	e.waitEffects(len(ids), 180*time.Second)
	e.waitCommitted(map[int]int64{0: 500, 1: 500, 2: 500, 3: 500}, 60*time.Second)
	e.check(expectation{ids: ids})
}

// TestAPauseHoldsAcrossARebalance: a pause written by another process holds
// on whichever member owns the partition, through a member joining and the
// first member leaving; resumed, the partition is processed once.
func TestAPauseHoldsAcrossARebalance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, 2)
	ids := e.produceIDs("r", 200)
	store, err := pauses.NewStore(e.db.Schema)
	require.NoError(t, err)
	_, err = store.Pause(ctx, e.db.Pool, e.name, pauses.Partition(e.topic, 0), "ops", "inspect")
	require.NoError(t, err)

	member := func() (*running, *pauseWatch) {
		w := &pauseWatch{}
		cfg := e.config(e.applyHandler())
		cfg.Hooks = append(cfg.Hooks, w)
		return e.start(cfg), w
	}
	a, wa := member()
	e.waitCommitted(map[int]int64{1: 100}, 60*time.Second)
	waitFor(t, 30*time.Second, "A reports partition 0 paused", func() bool { return wa.paused(0) })
	_, wb := member()
	e.kafka.Produce(t, e.topic, msg(0, "r-late-0", "v"), msg(1, "r-late-1", "v"))
	ids = append(ids, "r-late-0", "r-late-1")
	e.waitCommitted(map[int]int64{1: 101}, 60*time.Second)
	a.stop()
	waitFor(t, 60*time.Second, "B reports partition 0 paused", func() bool { return wb.paused(0) })
	stillFor(t, 1500*time.Millisecond, "partition 0 applied while paused", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE partition = 0`) == 0
	})
	_, err = store.Resume(ctx, e.db.Pool, e.name, pauses.Partition(e.topic, 0))
	require.NoError(t, err)
	e.waitCommitted(map[int]int64{0: 101, 1: 101}, 60*time.Second)
	e.check(expectation{ids: ids})
}

// TestUnreadablePausesHoldEveryPartition: while the pauses cannot be read no partition
// fetches (a pause must hold across a restart), and Run still returns
// promptly when cancelled.
func TestUnreadablePausesHoldEveryPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	ids := e.produceIDs("u", 40)
	db := newPauseReadDB(e.db.Pool)
	db.failing.Store(true)
	r := e.start(e.config(e.applyHandler()), db)
	waitFor(t, 30*time.Second, "both partitions assigned", func() bool { n, _ := e.events.assignments(); return n >= 2 })
	waitFor(t, 10*time.Second, "reads of the pauses tried", func() bool { return db.reads.Load() >= 2 })
	stillFor(t, 1500*time.Millisecond, "a partition applied before its pauses were read", func() bool { return e.effects() == 0 })
	start := time.Now()
	r.stop()
	require.Less(t, time.Since(start), 8*time.Second, "Run took long to return while the pauses could not be read")

	db.failing.Store(false)
	e.start(e.config(e.applyHandler()), db)
	e.waitCommitted(map[int]int64{0: 20, 1: 20}, 60*time.Second)
	e.check(expectation{ids: ids})
}

// TestAResumeStartsFromTheStoredPosition: "Resume ... and the partition
// fetches again from its stored position". An operator pauses a partition
// to inspect it and moves its stored position past a bad stretch
// (offsets.Store.Reset); once resumed, processing starts at the stored
// position: the stretch passed over is not applied.
func TestAResumeStartsFromTheStoredPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, 1)
	ids := e.produceIDs("s", 20)
	watch := &pauseWatch{}
	cfg := e.config(e.applyHandler())
	cfg.Hooks = append(cfg.Hooks, watch)
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	defer e.run(c).stop()
	e.waitCommitted(map[int]int64{0: 20}, 60*time.Second)
	require.NoError(t, c.Pause(ctx, pauses.Partition(e.topic, 0), "inspecting"))
	waitFor(t, 10*time.Second, "paused", func() bool { return watch.paused(0) })
	bad := e.produceIDs("bad", 5) // offsets 20..24: to be passed over
	good := e.produceIDs("good", 5)
	os, err := offsets.NewStore(e.db.Schema)
	require.NoError(t, err)
	require.NoError(t, os.Reset(ctx, e.db.Pool, e.name, e.topic, 0, 25))
	require.NoError(t, c.Resume(ctx, pauses.Partition(e.topic, 0)))
	e.waitCommitted(map[int]int64{0: 30}, 60*time.Second)
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id LIKE 'bad-%'`),
		"messages %v, below the stored position set while paused, were applied after the resume", bad)
	e.requireExactlyOnce(append(ids, good...))
	require.Empty(t, e.snapshotStopped(), "partitions stopped")
}

// The stored position moved back, or deleted, while a partition was
// paused is read again at the resume, before any fetch: the messages from
// it on are processed again (the claims an operator forgot are applied
// again, the others skipped), without waiting for a new message.
func TestAResumeGoesBackToAPositionMovedBack(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"reset back", "deleted"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := setup(t, 1)
			ids := e.produceIDs("s", 20)
			watch := &pauseWatch{}
			cfg := e.config(e.applyHandler())
			cfg.Hooks = append(cfg.Hooks, watch)
			c, err := consumer.New(e.db.Pool, cfg)
			require.NoError(t, err)
			defer e.run(c).stop()
			e.waitCommitted(map[int]int64{0: 20}, 60*time.Second)
			require.NoError(t, c.Pause(ctx, pauses.Partition(e.topic, 0), "re-applying s-15 and after"))
			waitFor(t, 10*time.Second, "paused", func() bool { return watch.paused(0) })
			os, err := offsets.NewStore(e.db.Schema)
			require.NoError(t, err)
			if how == "reset back" {
				require.NoError(t, os.Reset(ctx, e.db.Pool, e.name, e.topic, 0, 5))
			} else {
				e.db.Exec(t, `DELETE FROM `+e.db.Table("consumer_offsets")+` WHERE consumer = $1`, e.name)
			}
			e.db.Exec(t, `DELETE FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1")+` AND message_id IN ('s-15', 's-16', 's-17', 's-18', 's-19')`, e.name)
			e.db.Exec(t, `DELETE FROM `+e.db.Table("effects")+` WHERE message_id IN ('s-15', 's-16', 's-17', 's-18', 's-19')`)
			require.NoError(t, c.Resume(ctx, pauses.Partition(e.topic, 0)))
			waitFor(t, 30*time.Second, "s-15 to s-19 applied again, with no message produced", func() bool {
				return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id IN ('s-15', 's-16', 's-17', 's-18', 's-19')`) == 5
			})
			e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
			e.requireExactlyOnce(ids)
			require.Empty(t, e.snapshotStopped(), "partitions stopped")
		})
	}
}

func (e *env) snapshotStopped() []*consumer.PartitionError { return e.events.snapshot().stopped }
