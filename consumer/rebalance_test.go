package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// childSpec tells a child test process which consumer to run.
type childSpec struct {
	DatabaseURL string
	Schema      string
	Brokers     []string
	Topic       string
	Group       string
	Name        string
	// KillOn names a message id whose handler kills the process; when
	// empty, and Serve and KillAfterApplied are false, the process is
	// killed right after its first batch commits.
	KillOn      string
	MaxAttempts int
	// Serve runs until SIGTERM (then drains and exits 0) instead of being
	// killed.
	Serve bool
	// Slow is how long the handler takes per message.
	Slow time.Duration
	// IdleInTransaction is the session timeout of the child's transactions.
	IdleInTransaction time.Duration
	// Share makes the child a member of the share group Group.
	Share bool
	// FailOn names a message id whose handler fails, transiently, on its
	// first FailCalls calls in the process. In a share group the first
	// failure undoes the transaction (it takes no savepoints until a
	// handler failed); a failure in one with savepoints commits the
	// messages before it, and the next transaction starts from it.
	FailOn    string
	FailCalls int
	// KillAfterApplied kills the process from OnMessageApplied, right after
	// the first transaction that applied messages committed: in a share
	// group, before any of its records is accepted.
	KillAfterApplied bool
	// Protocol is the group protocol the child's member speaks; under the
	// consumer protocol its session is the group's (see setupProtocol).
	Protocol consumer.GroupProtocol
}

const childEnv = "KAFKAONCE_TEST_CHILD_CONSUMER"

// TestChildConsumerProcess is not a test: it is the consumer process that
// TestKilledBetweenDatabaseCommitAndOffsetCommit starts and kills.
func TestChildConsumerProcess(t *testing.T) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		t.Skip("runs only as a child of TestKilledBetweenDatabaseCommitAndOffsetCommit")
	}
	var spec childSpec
	require.NoError(t, json.Unmarshal([]byte(raw), &spec))
	pool, err := pgxpool.New(context.Background(), spec.DatabaseURL)
	require.NoError(t, err)
	effects := `INSERT INTO ` + pgx.Identifier{spec.Schema, "effects"}.Sanitize() + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
	var hooks []consumer.Hook
	switch {
	case spec.KillAfterApplied:
		hooks = append(hooks, killOnApplied{})
	case spec.KillOn == "" && !spec.Serve:
		hooks = append(hooks, killAfterFirstCommit{})
	}
	var failed atomic.Int32
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	handlerTimeout := consumer.DefaultHandlerTimeout
	if spec.IdleInTransaction > 0 {
		handlerTimeout = spec.IdleInTransaction / 2
	}
	cfg := &consumer.Config{
		Name: spec.Name, KafkaClient: kafkaClient(), GroupID: spec.Group, Brokers: spec.Brokers, Topics: []string{spec.Topic}, Schema: spec.Schema,
		MaxBatch: 20, SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond, Retry: consumer.RetryPolicy{MaxAttempts: spec.MaxAttempts},
		IdleInTransactionTimeout: spec.IdleInTransaction, HandlerTimeout: handlerTimeout, ShutdownTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.ID == spec.KillOn {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {}
			}
			if m.ID == spec.FailOn && int(failed.Add(1)) <= spec.FailCalls {
				return errors.New("transient failure")
			}
			time.Sleep(spec.Slow)
			_, err := tx.Exec(ctx, effects, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
			return err
		}),
		Hooks: hooks,
	}
	if spec.Share {
		cfg.GroupType, cfg.KafkaClient = consumer.ShareGroup, consumer.FranzGo
	}
	if spec.Protocol == consumer.ConsumerProtocol {
		cfg.GroupProtocol, cfg.SessionTimeout, cfg.HeartbeatInterval = spec.Protocol, 0, 0
	}
	c, err := consumer.New(pool, cfg)
	require.NoError(t, err)
	require.NoError(t, c.Run(ctx))
	if !spec.Serve {
		t.Fatal("the child consumer should have been killed")
	}
}

// killAfterFirstCommit kills the process right after the first batch's
// database commit, before its offset reaches the Kafka committer.
type killAfterFirstCommit struct{}

func (killAfterFirstCommit) OnBatchEnd(_ context.Context, _ consumer.BatchInfo, r consumer.BatchResult) {
	if r.Err == nil {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
}

// killOnApplied kills the process from the first OnMessageApplied: the
// hook runs once the transaction that applied the message committed, and
// in a share group before the member accepts the transaction's records
// (see shareMember.settleCommitted).
type killOnApplied struct{}

func (killOnApplied) OnMessageApplied(context.Context, *consumer.Message) {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func TestKilledBetweenDatabaseCommitAndOffsetCommit(t *testing.T) {
	t.Parallel()
	eachProtocol(t, func(t *testing.T, proto consumer.GroupProtocol) {
		killedBetweenCommits(t, setupProtocol(t, 2, proto))
	})
}

func killedBetweenCommits(t *testing.T, e *env) {
	ids := e.produceIDs("k", 200)

	e.runChildUntilKilled(childSpec{DatabaseURL: e.db.URL, Schema: e.db.Schema, Brokers: e.kafka.Brokers, Topic: e.topic, Group: e.group, Name: e.name, Protocol: e.protocol}, time.Minute)

	// The child died with at least one batch durable in Postgres and its
	// offset never committed to Kafka.
	stored := e.storedPositions()
	committed := e.kafka.CommittedOffsets(t, e.group, e.topic, 2)
	var ahead int
	for p, pos := range stored {
		if pos > committed[p] {
			ahead++
		}
	}
	require.Positive(t, ahead, "a partition's stored position is ahead of its committed offset (stored %v, committed %v)", stored, committed)
	// Read in one statement, so in one snapshot: a batch the child had sent
	// whole (BEGIN to COMMIT) before it died may still commit on the server
	// after the child is gone, and it moves both figures together.
	var durable, effects int64
	require.NoError(t, e.db.Pool.QueryRow(context.Background(), `SELECT
	(SELECT coalesce(sum(next_offset), 0) FROM `+e.db.Table("consumer_offsets")+` WHERE consumer = $1 AND topic = $2),
	(SELECT count(*) FROM `+e.db.Table("effects")+`)`, e.name, e.topic).Scan(&durable, &effects))
	require.Equal(t, durable, effects, "the stored positions account for exactly the durable effects")

	// A new process takes over and finishes the topic.
	r := e.start(e.config(e.applyHandler()))
	e.waitEffects(len(ids), 60*time.Second)
	e.waitCommitted(map[int]int64{0: 100, 1: 100}, 30*time.Second)
	r.stop()
	e.requireExactlyOnce(ids)
	require.Equal(t, map[int]int64{0: 100, 1: 100}, e.storedPositions())
	e.check(expectation{ids: ids})
}

// runChildUntilKilled runs a child consumer process and requires that it was
// killed with SIGKILL within timeout.
func (e *env) runChildUntilKilled(spec childSpec, timeout time.Duration) {
	e.t.Helper()
	killed, out := e.runChild(spec, timeout)
	require.True(e.t, killed, "the child was not killed:\n%s", out)
}

// runChild runs a child consumer process until it dies, until done reports
// true (then it is sent SIGTERM), or for at most timeout, and reports whether
// it died of SIGKILL.
func (e *env) runChild(spec childSpec, timeout time.Duration, done ...func() bool) (killed bool, output string) {
	return e.runChildPID(spec, timeout, nil, done...)
}

// runChildPID is runChild that also sends the child's pid to pid.
func (e *env) runChildPID(spec childSpec, timeout time.Duration, pid chan<- int, done ...func() bool) (killed bool, output string) {
	e.t.Helper()
	raw, err := json.Marshal(spec)
	require.NoError(e.t, err)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestChildConsumerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 20 * time.Second
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(e.t, cmd.Start())
	if pid != nil {
		pid <- cmd.Process.Pid
	}
	exited := make(chan struct{})
	go func() {
		for _, d := range done {
			for {
				select {
				case <-exited:
					return
				case <-time.After(100 * time.Millisecond):
				}
				if d() {
					cancel()
					return
				}
			}
		}
	}()
	_ = cmd.Wait()
	close(exited)
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL, out.String()
}

func TestMemberJoinsAndLeavesWhileBatchesAreInFlight(t *testing.T) {
	t.Parallel()
	e := setup(t, 6)
	const total = 3000
	slow := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		time.Sleep(500 * time.Microsecond) // keep batches in flight across rebalances
		return e.applyHandler().Handle(ctx, tx, m)
	})

	// Produce in the background for the whole test.
	var produced atomic.Int64
	prodDone := make(chan struct{})
	go func() {
		defer close(prodDone)
		w := e.kafka.Writer(e.topic)
		defer w.Close()
		for i := 0; i < total; i += 100 {
			var msgs []kafka.Message
			for j := i; j < i+100; j++ {
				msgs = append(msgs, msg(j%6, "j-"+strconv.Itoa(j), "v"))
			}
			if err := w.WriteMessages(context.Background(), msgs...); err != nil {
				panic(fmt.Sprintf("produce: %v", err))
			}
			produced.Add(100)
			time.Sleep(30 * time.Millisecond)
		}
	}()

	a := e.config(slow)
	a.MaxBatch = 50
	ra := e.start(a)
	e.waitEffects(300, 60*time.Second)

	joiner := &recorder{}
	b := e.config(slow)
	b.MaxBatch = 50
	b.Hooks = []consumer.Hook{joiner}
	rb := e.start(b)
	waitFor(t, 60*time.Second, "the second member to apply messages", func() bool { return joiner.snapshot().applied >= 100 })
	rb.stop() // leaves the group with the rest still flowing

	<-prodDone
	e.waitEffects(total, 90*time.Second)
	offsets := map[int]int64{}
	for p := 0; p < 6; p++ {
		offsets[p] = total / 6
	}
	e.waitCommitted(offsets, 30*time.Second)
	ra.stop()

	ids := make([]string, total)
	for i := range ids {
		ids[i] = "j-" + strconv.Itoa(i)
	}
	e.requireExactlyOnce(ids)
	require.Equal(t, total, e.events.snapshot().applied+joiner.snapshot().applied)
	t.Logf("first member applied %d, the member that came and went applied %d", e.events.snapshot().applied, joiner.snapshot().applied)
	e.check(expectation{ids: ids})
}

// TestIdleMembersDoNotRebalanceTheGroup runs more members than partitions:
// once the group has settled, the members with no partition must sit
// quietly, so the group stays in one generation and the busy member keeps
// its partition while it processes what is produced meanwhile.
//
// The group has settled when every member is in the same generation and
// the member holding the partition in it has reported the assignment.
// That report comes after the generation started (the worker first reads
// the stored position and the log's bounds), and may come after the
// messages produced before are all applied: the same member may have
// applied them in an earlier generation, before the others joined.
func TestIdleMembersDoNotRebalanceTheGroup(t *testing.T) {
	t.Parallel()
	for _, members := range []int{2, 3} {
		t.Run(strconv.Itoa(members)+" members", func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			ids := e.produceIDs("before", 20)

			gens := make([]*generationLog, members)
			recs := make([]*recorder, members)
			runs := make([]*running, members)
			for i := range members {
				gens[i], recs[i] = newGenerationLog(testLogger(t).Handler()), &recorder{}
				cfg := e.config(e.applyHandler())
				cfg.Logger = slog.New(gens[i])
				cfg.Hooks = []consumer.Hook{recs[i]}
				runs[i] = e.start(cfg)
			}
			e.waitEffects(len(ids), 60*time.Second)
			// A member starts a generation only once the workers of its
			// previous one returned, and a worker's hooks' context ends
			// when it returns: once every member has logged the same
			// generation, an assignment still held is one of that
			// generation.
			settled := -1
			assigned, held := make([]int, members), make([]int, members)
			waitFor(t, 60*time.Second, "every member in the same generation, one of them holding the partition", func() bool {
				gen := gens[0].latest()
				sameGeneration := func() bool {
					for _, g := range gens {
						if g.latest() < 0 || g.latest() != gen {
							return false
						}
					}
					return true
				}
				if !sameGeneration() {
					return false
				}
				holders := 0
				for i, r := range recs {
					assigned[i], held[i] = r.assignments()
					holders += held[i]
				}
				settled = gen
				return holders == 1 && sameGeneration()
			})

			// A quiet period with traffic: nothing changes in the group.
			w := e.kafka.Writer(e.topic)
			for i := range 40 {
				id := "during-" + strconv.Itoa(i)
				require.NoError(t, w.WriteMessages(context.Background(), msg(0, id, "v-"+id)))
				ids = append(ids, id)
				time.Sleep(200 * time.Millisecond)
			}
			require.NoError(t, w.Close())
			e.waitEffects(len(ids), 30*time.Second)

			newGenerations, newAssignments, stillHeld := make([]int, members), make([]int, members), make([]int, members)
			for i := range members {
				newGenerations[i] = len(gens[i].since(settled)) - 1
				var reported int
				reported, stillHeld[i] = recs[i].assignments()
				newAssignments[i] = reported - assigned[i]
			}
			require.Equal(t, make([]int, members), newAssignments, "partition assignments per member during the quiet period")
			require.Equal(t, make([]int, members), newGenerations, "generations started per member after generation %d", settled)
			require.Equal(t, held, stillHeld, "partitions held per member at the end of the quiet period")
			for _, r := range runs {
				r.stop()
			}
			e.requireExactlyOnce(ids)
			e.check(expectation{ids: ids})
		})
	}
}

// generationLog is a slog handler that keeps the id of every generation a
// member started, and passes every record on.
type generationLog struct {
	next slog.Handler
	seen *generationsSeen
}

type generationsSeen struct {
	mu  sync.Mutex
	ids []int
}

func newGenerationLog(next slog.Handler) *generationLog {
	return &generationLog{next: next, seen: &generationsSeen{}}
}

func (g *generationLog) Enabled(context.Context, slog.Level) bool { return true }

func (g *generationLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "consumer group: generation started" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "generation" {
				g.seen.mu.Lock()
				g.seen.ids = append(g.seen.ids, int(a.Value.Int64()))
				g.seen.mu.Unlock()
			}
			return true
		})
	}
	if g.next.Enabled(ctx, r.Level) {
		return g.next.Handle(ctx, r)
	}
	return nil
}

func (g *generationLog) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &generationLog{next: g.next.WithAttrs(attrs), seen: g.seen}
}

func (g *generationLog) WithGroup(name string) slog.Handler {
	return &generationLog{next: g.next.WithGroup(name), seen: g.seen}
}

// latest returns the id of the last generation started, or -1.
func (g *generationLog) latest() int {
	g.seen.mu.Lock()
	defer g.seen.mu.Unlock()
	if len(g.seen.ids) == 0 {
		return -1
	}
	return g.seen.ids[len(g.seen.ids)-1]
}

// since returns the ids of the generations started from id on.
func (g *generationLog) since(id int) []int {
	g.seen.mu.Lock()
	defer g.seen.mu.Unlock()
	for i, got := range g.seen.ids {
		if got == id {
			return append([]int(nil), g.seen.ids[i:]...)
		}
	}
	return nil
}
