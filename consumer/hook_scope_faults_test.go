package consumer_test

// The scope hooks (HookBatchScope, HookHandlerScope) under faults, against
// the promises of docs/guarantee.md: each message applied once; the Kafka
// offset never ahead of the database, and what committed handed on once;
// every scope begun ends exactly once; a misbehaving hook breaks none of
// these, nor shutdown; hook payloads come once per committed fact and
// match what happened. Each test says the interleaving it drives.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
)

type hookScopeKey struct{}

// scopeLedger is a scope hook that books every scope begun and ended and every
// hook called for what a transaction did, per scope and per message id.
// Its knobs make it misbehave.
type scopeLedger struct {
	// Misbehaviour: what ScopeBatch / ScopeHandler do to the context they
	// return (nil: return it as made).
	batchCtx   func(context.Context) context.Context
	handlerCtx func(context.Context) context.Context

	mu        sync.Mutex
	n         int
	open      map[int]bool
	endCount  map[int]int
	result    map[int]*consumer.BatchResult // OnBatchEnd's, per scope
	facts     map[int]int                   // applied/skipped/dead-lettered hooks, per scope
	outside   []string
	hBegun    int
	hEnded    int
	hEndErrs  []error
	perID     map[string]int // applied + skipped + dead-lettered reports per id
	applied   map[string]int
	dead      map[string]int
	runDone   atomic.Bool
	lateEnds  atomic.Int32 // scope ends called after Run returned
	scopeMsgs map[int][]string
}

func newScopeLedger() *scopeLedger {
	return &scopeLedger{open: map[int]bool{}, endCount: map[int]int{}, result: map[int]*consumer.BatchResult{},
		facts: map[int]int{}, perID: map[string]int{}, applied: map[string]int{}, dead: map[string]int{}, scopeMsgs: map[int][]string{}}
}

func (l *scopeLedger) ScopeBatch(ctx context.Context, b consumer.BatchInfo, msgs []*consumer.Message) (context.Context, func()) {
	l.mu.Lock()
	l.n++
	n := l.n
	l.open[n] = true
	for _, m := range msgs {
		l.scopeMsgs[n] = append(l.scopeMsgs[n], m.ID)
	}
	l.mu.Unlock()
	ctx = context.WithValue(ctx, hookScopeKey{}, n)
	if l.batchCtx != nil {
		ctx = l.batchCtx(ctx)
	}
	return ctx, func() {
		if l.runDone.Load() {
			l.lateEnds.Add(1)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.open, n)
		l.endCount[n]++
	}
}

func (l *scopeLedger) ScopeHandler(ctx context.Context, m *consumer.Message) (context.Context, func(error)) {
	l.mu.Lock()
	l.hBegun++
	l.mu.Unlock()
	if l.handlerCtx != nil {
		ctx = l.handlerCtx(ctx)
	}
	return ctx, func(err error) {
		if l.runDone.Load() {
			l.lateEnds.Add(1)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.hEnded++
		l.hEndErrs = append(l.hEndErrs, err)
	}
}

// scope returns the open batch scope of ctx, booking hook as outside when
// there is none.
func (l *scopeLedger) scope(ctx context.Context, hook string) int {
	n, ok := ctx.Value(hookScopeKey{}).(int)
	if !ok || !l.open[n] {
		l.outside = append(l.outside, hook)
	}
	return n
}

func (l *scopeLedger) OnBatchStart(ctx context.Context, _ consumer.BatchInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.scope(ctx, "OnBatchStart")
}

func (l *scopeLedger) OnBatchEnd(ctx context.Context, _ consumer.BatchInfo, r consumer.BatchResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.scope(ctx, "OnBatchEnd")
	if l.result[n] != nil {
		l.outside = append(l.outside, fmt.Sprintf("OnBatchEnd twice in scope %d", n))
	}
	l.result[n] = &r
}

func (l *scopeLedger) fact(ctx context.Context, hook, id string) {
	n := l.scope(ctx, hook)
	if l.result[n] == nil {
		l.outside = append(l.outside, hook+" before OnBatchEnd")
	}
	l.facts[n]++
	l.perID[id]++
}

func (l *scopeLedger) OnMessageApplied(ctx context.Context, m *consumer.Message) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fact(ctx, "OnMessageApplied", m.ID)
	l.applied[m.ID]++
}

func (l *scopeLedger) OnMessageSkipped(ctx context.Context, m *consumer.Message, _ consumer.SkipReason) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fact(ctx, "OnMessageSkipped", m.ID)
}

func (l *scopeLedger) OnMessageDeadLettered(ctx context.Context, m *consumer.Message, _ consumer.DeadLettered) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fact(ctx, "OnMessageDeadLettered", m.ID)
	l.dead[m.ID]++
}

// requireBalanced: every batch scope begun ended exactly once, every hook
// ran inside an open scope, every handler scope begun ended.
func (l *scopeLedger) requireBalanced(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.outside, "hooks called outside their batch scope (or out of order)")
	require.Empty(t, l.open, "batch scopes never ended")
	for n := 1; n <= l.n; n++ {
		require.Equalf(t, 1, l.endCount[n], "batch scope %d ended %d times", n, l.endCount[n])
	}
	require.Equal(t, l.hBegun, l.hEnded, "handler scopes begun vs ended")
}

// requireOneFactPerID: each id reported once (applied, skipped or set
// aside), and only ids in want.
func (l *scopeLedger) requireOneFactPerID(t *testing.T, want []string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	got := map[string]int{}
	for k, v := range l.perID {
		got[k] = v
	}
	for _, id := range want {
		require.Equalf(t, 1, got[id], "reports (applied+skipped+dead-lettered) of %s", id)
		delete(got, id)
	}
	require.Empty(t, got, "reports of ids never produced")
}

// Scope hooks across a lost COMMIT reply: the first batch's COMMIT
// commits on the server, its reply is dropped (unknown outcome), the batch
// runs again in a new scope and finds every claim taken. Every scope ends
// once, afterCommit's hooks run only in the scope of the transaction whose
// commit was seen (never in the unknown one's), each id is reported once,
// and the Kafka offset lands at the stored position.
func TestScopeLostCommitReplyEndsEveryScopeOnce(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		proxy, err := faultproxy.Start(e.db.ServerAddr(t))
		require.NoError(t, err)
		t.Cleanup(func() { proxy.Close() })
		l := newScopeLedger()
		var cfg *consumer.Config
		if batched {
			cfg = batchConfig(e, &batchEffects{e: e})
		} else {
			cfg = e.config(e.applyHandler())
		}
		errs := &batchErrors{}
		cfg.Hooks = append(cfg.Hooks, l, errs, armOnFirstBatch{proxy: proxy, once: &sync.Once{}})
		r := e.start(cfg, e.db.PoolVia(t, proxy.Addr()))
		e.waitRecorded()
		ids := e.produceIDs("lc", 40)
		e.waitCommitted(map[int]int64{0: 40}, 30*time.Second)
		r.stop()

		require.EqualValues(t, 1, proxy.Dropped(), "the fault was injected")
		require.Equal(t, 1, errs.containing("commit outcome unknown"))
		e.requireExactlyOnce(ids)
		require.Equal(t, map[int]int64{0: 40}, e.storedPositions())
		l.requireBalanced(t)
		l.requireOneFactPerID(t, ids)
		l.mu.Lock()
		defer l.mu.Unlock()
		for n, c := range l.facts {
			require.NotNilf(t, l.result[n], "scope %d reported facts without OnBatchEnd", n)
			require.NoErrorf(t, l.result[n].Err, "scope %d: facts reported for a transaction whose outcome was unknown", n)
			require.Positive(t, c)
		}
	})
}

// A savepoint transaction cut short by a transient failure commits the
// messages before the failure, and OnBatchEnd says how many besides the
// failure (BatchResult.Committed), so that a hook does not take a
// committed transaction for a failed one (otelhooks's own tests show its
// span).
//
// Interleaving: batch [m0 m1 m2 m3 m4]; m1 fails permanently -> the
// transaction rolls back, and runs again with m1 set aside and savepoints
// from m2; m3 fails transiently in its savepoint -> the transaction is cut
// at m3 and COMMITs m0, m1 (dead letter), m2 -> OnBatchEnd(Err: m3's
// error, Committed: 3), then OnMessageApplied(m0, m2) and
// OnMessageDeadLettered(m1) in the same scope.
func TestScopeCutTransactionSaysWhatCommitted(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := []string{"m0", "m1", "m2", "m3", "m4"}
	for i, id := range ids {
		e.kafka.Produce(t, e.topic, msg(0, id, fmt.Sprint("v", i)))
	}
	var m3Failed atomic.Bool
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "m1":
			return consumer.Permanent(errors.New("poison"))
		case m.ID == "m3" && m3Failed.CompareAndSwap(false, true):
			return errors.New("partner API unavailable")
		}
		return apply.Handle(ctx, tx, m)
	})
	l := newScopeLedger()
	cfg := e.config(h)
	cfg.Hooks = append(cfg.Hooks, l)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	r.stop()

	e.requireExactlyOnce([]string{"m0", "m2", "m3", "m4"})
	require.Len(t, e.letters(), 1)
	require.True(t, m3Failed.Load(), "the cut happened")
	l.requireBalanced(t)
	l.requireOneFactPerID(t, ids)

	// The engine's payloads.
	l.mu.Lock()
	var contradictions []string
	for n, c := range l.facts {
		if c > 0 && l.result[n] != nil && l.result[n].Committed != c {
			contradictions = append(contradictions, fmt.Sprintf("scope %d %v: %d messages reported applied/set aside, OnBatchEnd Committed=%d Err=%v",
				n, l.scopeMsgs[n], c, l.result[n].Committed, l.result[n].Err))
		}
	}
	l.mu.Unlock()

	assert.Empty(t, contradictions, "OnBatchEnd's Committed disagrees with the messages reported committed")
}

// A handler that hangs past HandlerTimeout, ignoring its context, is
// abandoned after the grace, and its handler scope ends then, with the
// abandonment error: a scope ended only when the call returns would never
// end for a call that never does (otelhooks: a "process" span never
// exported), or would end from the abandoned goroutine after Run returned.
//
// Interleaving: h-2's first call blocks on a channel; HandlerTimeout
// (300ms) passes, hctx is cancelled, 2s later the attempt is abandoned,
// its batch scope ends; h-2 runs alone, is applied; offsets commit; Run is
// stopped. Handler scopes begun equal those ended once the attempt is
// abandoned.
func TestScopeAbandonedHandlerScopeEndsAtAbandonment(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("h", 5)
	release := make(chan struct{})
	var released sync.Once
	t.Cleanup(func() { released.Do(func() { close(release) }) })
	var hung atomic.Bool
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "h-2" && hung.CompareAndSwap(false, true) {
			<-release // ignores ctx
			return errors.New("released")
		}
		return apply.Handle(ctx, tx, m)
	})
	l := newScopeLedger()
	cfg := e.config(h)
	cfg.HandlerTimeout = 300 * time.Millisecond
	cfg.Hooks = append(cfg.Hooks, l)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 40*time.Second)
	r.stop()
	l.runDone.Store(true)

	e.requireExactlyOnce(ids)
	l.mu.Lock()
	begun, ended := l.hBegun, l.hEnded
	l.mu.Unlock()
	// Let the hung call go, and see when its scope ends.
	released.Do(func() { close(release) })
	waitFor(t, 10*time.Second, "the hung call's scope to end once released", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.hEnded == l.hBegun
	})
	assert.Equalf(t, begun, ended, "handler scopes begun vs ended after the worker abandoned the hung call, moved on and Run returned")
	assert.Zero(t, l.lateEnds.Load(), "scope ends called after Run returned")
}

// A batch scope whose context does not carry the worker's cancellation
// (context.WithoutCancel: a hook that wants its span's context to outlive
// the batch) lends only its values: shutdown and ShutdownTimeout still
// reach a handler that waits on its context, and the rule that a cut-off
// handler is abandoned after two seconds (guarantee.md, "A handler that
// is cut off stays cut off") still applies.
//
// Interleaving: the handler blocks on <-ctx.Done() (well behaved); Run's
// context is cancelled; ShutdownTimeout (1s) passes. Run returns within
// ShutdownTimeout and the 2s grace (with slack), as it does without the
// hook (the control subtest), not after HandlerTimeout (20s).
func TestScopeDetachedBatchContextDoesNotHoldShutdown(t *testing.T) {
	t.Parallel()
	for _, detach := range []bool{false, true} {
		t.Run(fmt.Sprintf("detached=%v", detach), func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			e.produceIDs("d", 3)
			entered := make(chan struct{})
			var once sync.Once
			h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				once.Do(func() { close(entered) })
				<-ctx.Done()
				return ctx.Err()
			})
			l := newScopeLedger()
			if detach {
				l.batchCtx = context.WithoutCancel
			}
			cfg := e.config(h)
			cfg.HandlerTimeout = 20 * time.Second
			cfg.ShutdownTimeout = time.Second
			cfg.Hooks = append(cfg.Hooks, l)
			r := e.start(cfg)
			select {
			case <-entered:
			case <-time.After(30 * time.Second):
				t.Fatal("the handler was never called")
			}
			began := time.Now()
			r.cancel()
			var took time.Duration
			select {
			case err := <-r.done:
				require.NoError(t, err)
				took = time.Since(began)
			case <-time.After(8 * time.Second):
				err := <-r.done // bounded by HandlerTimeout + grace
				require.NoError(t, err)
				took = time.Since(began)
			}
			r.done = nil
			l.runDone.Store(true)
			require.Zero(t, e.effects(), "nothing applied")
			require.Empty(t, e.letters(), "nothing set aside at shutdown")
			l.requireBalanced(t)
			require.Lessf(t, took, 8*time.Second, "Run took %v to return after cancel (ShutdownTimeout 1s, grace 2s, HandlerTimeout 20s)", took)
		})
	}
}

// A batch scope that returns a context already cancelled lends only its
// values: the engine's context decides cancellation, so the batch runs
// and every message is applied once, instead of every BEGIN failing on the
// hook's context and the partition retrying for ever.
func TestScopeCancelledBatchContextStopsNothing(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		ids := e.produceIDs("x", 5)
		l := newScopeLedger()
		l.batchCtx = func(ctx context.Context) context.Context {
			c, cancel := context.WithCancel(ctx)
			cancel()
			return c
		}
		var cfg *consumer.Config
		if batched {
			cfg = batchConfig(e, &batchEffects{e: e})
		} else {
			cfg = e.config(e.applyHandler())
		}
		cfg.Hooks = append(cfg.Hooks, l)
		r := e.start(cfg)
		e.waitEffects(len(ids), 30*time.Second)
		began := time.Now()
		r.stop()
		require.Less(t, time.Since(began), 5*time.Second)
		l.runDone.Store(true)
		e.requireExactlyOnce(ids)
		require.Empty(t, e.letters())
		l.requireBalanced(t)
	})
}

// A handler scope that returns a nil context (a hook's bug) is not blamed
// on the messages: the engine keeps its own context, and every message is
// applied, where tx.Exec(nil, ...) would panic inside pgx and have each
// message classed permanent (ClassPanic) and set aside.
func TestScopeNilHandlerContextSetsNothingAside(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("n", 5)
	l := newScopeLedger()
	l.handlerCtx = func(context.Context) context.Context { return nil }
	cfg := e.config(e.applyHandler())
	cfg.Hooks = append(cfg.Hooks, l)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 40*time.Second)
	r.stop()
	l.runDone.Store(true)
	l.requireBalanced(t)
	letters := e.letters()
	var classes []string
	for id, lt := range letters {
		classes = append(classes, id+":"+string(lt.Class))
	}
	require.Emptyf(t, classes, "messages set aside (id:class) because a hook returned a nil context")
	e.requireExactlyOnce(ids)
}

// Shutdown while a transaction is in flight with scope hooks: the
// handler of the second batch waits on its context; Run is cancelled; the
// transaction rolls back at ShutdownTimeout. Every scope begun ends before
// Run returns, nothing is reported for the rolled-back attempt, the Kafka
// offset is not ahead of the stored position, and the next run applies
// the rest once.
func TestScopeShutdownMidTransactionEndsScopes(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	first := e.produceIDs("s", 3)
	apply := e.applyHandler()
	var block atomic.Bool
	entered := make(chan struct{})
	var once sync.Once
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := apply.Handle(ctx, tx, m); err != nil {
			return err
		}
		if block.Load() {
			once.Do(func() { close(entered) })
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	l := newScopeLedger()
	cfg := e.config(h)
	cfg.ShutdownTimeout = 500 * time.Millisecond
	cfg.Hooks = append(cfg.Hooks, l)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	block.Store(true)
	second := e.produceIDs("t", 3)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the second batch's handler was never called")
	}
	r.stop()
	l.runDone.Store(true)
	l.requireBalanced(t)
	require.Zero(t, l.lateEnds.Load())
	l.requireOneFactPerID(t, first)
	stored := e.storedPositions()[0]
	require.EqualValues(t, 3, stored, "the second batch rolled back")
	require.LessOrEqual(t, e.kafka.CommittedOffsets(t, e.group, e.topic, 1)[0], stored, "Kafka offset not ahead of the database")

	block.Store(false)
	l2 := newScopeLedger()
	cfg2 := e.config(h)
	cfg2.Hooks = append(cfg2.Hooks, l2)
	r2 := e.start(cfg2)
	e.waitCommitted(map[int]int64{0: 6}, 30*time.Second)
	r2.stop()
	e.requireExactlyOnce(append(append([]string{}, first...), second...))
	l2.requireBalanced(t)
	l2.requireOneFactPerID(t, second)
}

// A ScopeHandler that panics is recovered like a handler that panics: the
// process goes on, the message is retried or set aside, and the scopes
// already begun (a first hook's, the batch's) end. Unrecovered, it would
// run on the attempt's goroutine outside the handler's panic guard and
// kill the process, every partition and transaction with it. The test
// runs a consumer in a child process and expects it to survive.
//
// Interleaving: batch [p-0 p-1 p-2]; ScopeHandler panics for p-1 after
// ScopeBatch (and a first hook's ScopeHandler) began their scopes.
func TestScopePanickingScopeHandlerIsIgnored(t *testing.T) {
	if os.Getenv("KAFKAONCE_SCOPE_PANIC_CHILD") == "1" {
		panickingScopeChild(t)
		return
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestScopePanickingScopeHandlerIsIgnored$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "KAFKAONCE_SCOPE_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	tail := string(out)
	if i := strings.Index(tail, "panic:"); i >= 0 {
		tail = tail[i:min(len(tail), i+600)]
	} else if len(tail) > 1500 {
		tail = tail[len(tail)-1500:]
	}
	require.NoErrorf(t, err, "the child consumer process died; its output:\n%s", tail)
}

type panickyScope struct{ scopeLedger *scopeLedger }

func (p panickyScope) ScopeHandler(ctx context.Context, m *consumer.Message) (context.Context, func(error)) {
	if m.ID == "p-1" {
		panic("scope hook")
	}
	return ctx, func(error) {}
}

func panickingScopeChild(t *testing.T) {
	e := setup(t, 1)
	e.produceIDs("p", 3)
	l := newScopeLedger()
	cfg := e.config(e.applyHandler())
	cfg.Hooks = append(cfg.Hooks, l, panickyScope{scopeLedger: l})
	r := e.start(cfg)
	waitFor(t, 60*time.Second, "every message applied or set aside", func() bool {
		return e.distinctEffects()+int64(len(e.letters())) >= 3
	})
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	r.stop()
	l.requireBalanced(t)
}
