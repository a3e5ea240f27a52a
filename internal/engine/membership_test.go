package engine

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer/settings"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// memberSetup is a membership on a scripted group, whose partitions are
// worked by scripted workers (see workScript), set up as Run does, but
// for the group's end, which comes before the workers' (see end).
type memberSetup struct {
	*groupLog
	script *scriptGroup
	m      *membership
	// scripts are what each partition's workers do.
	scripts map[kafkaclient.TopicPartition]workScript
	// joins counts the calls of the membership's joined.
	joins atomic.Int32

	// group is the group's run context, and stopGroup ends it; stopRun
	// ends the membership's (Run's, which the workers' derive from).
	group              context.Context
	stopGroup, stopRun context.CancelFunc
	ran                chan struct{}
}

// workScript is what a scripted worker does with its partition: it
// commits batches up to each of batches, one after the other, then waits
// to be stopped; then it finishes the batch it is in, which takes until
// until happens (at most linger), and which commits up to last when last
// is set.
type workScript struct {
	batches []int64
	last    int64
	until   string
}

func newMemberSetup(t *testing.T, scripts map[kafkaclient.TopicPartition]workScript) *memberSetup {
	t.Helper()
	log := newGroupLog()
	s := &memberSetup{groupLog: log, script: &scriptGroup{log: log}, scripts: scripts}
	d := &deps{log: slog.New(slog.DiscardHandler), health: &health{}, cfg: Config{Config: settings.Config{ShutdownTimeout: time.Second}}}
	var runCtx context.Context
	runCtx, s.stopRun = context.WithCancel(context.Background())
	s.group, s.stopGroup = context.WithCancel(runCtx)
	s.m = newMembership(runCtx, d, s.script, func() { s.joins.Add(1) })
	s.m.work = s.work
	t.Cleanup(s.end)
	return s
}

// work is a scripted worker: a batch's database transaction commits
// (store), then the worker marks its offset, as worker.afterCommit does.
func (s *memberSetup) work(stop, _ context.Context, r *partitionRun) {
	script := s.scripts[r.tp]
	for _, next := range script.batches {
		s.store(r.tp, next)
		s.m.committer.mark(r, next, "")
	}
	<-stop.Done()
	s.add("stopping %s", partsText([]kafkaclient.TopicPartition{r.tp}))
	if script.until != "" {
		s.lingerUntil(script.until)
	}
	if script.last > 0 {
		s.store(r.tp, script.last)
		s.m.committer.mark(r, script.last, "")
	}
	s.add("worker %s stopped", partsText([]kafkaclient.TopicPartition{r.tp}))
}

// start runs the group on the script of calls until end.
func (s *memberSetup) start(calls ...groupCall) {
	s.script.calls = calls
	s.ran = make(chan struct{})
	go func() {
		defer close(s.ran)
		_ = s.script.RunGroup(s.group, s.m)
	}()
}

// end ends the group's run: the group revokes what is left, and then
// every worker has returned. (Run's one context ends both at once; the
// group's ends first here, so that its revocation, not the shutdown,
// stops the workers, in an order a test can write down.)
func (s *memberSetup) end() {
	s.stopGroup()
	if s.ran != nil {
		<-s.ran
	}
	s.stopRun()
	s.m.all.Wait()
}

func (s *memberSetup) flush() { s.m.committer.flush(context.Background()) }

func TestMembership(t *testing.T) {
	t.Parallel()

	t.Run("a revocation waits for the worker's batch in flight, and commits its offset, before it returns", func(t *testing.T) {
		t.Parallel()
		s := newMemberSetup(t, map[kafkaclient.TopicPartition]workScript{
			part(0): {batches: []int64{10}, last: 12, until: "revoked t/0"},
		})
		s.start(groupCall{kind: assign, parts: []kafkaclient.TopicPartition{part(0)}},
			groupCall{kind: revoke, parts: []kafkaclient.TopicPartition{part(0)}, after: "stored t/0@10"})
		s.requireEvent(t, "revoked t/0")
		s.end()
		require.Equal(t, []string{
			"assigning t/0", "stored t/0@10",
			"revoking t/0", "stopping t/0", "stored t/0@12", "worker t/0 stopped", "commit t/0@12", "revoked t/0",
		}, s.list())
	})

	t.Run("a revocation of some partitions leaves the others' workers running, and their marks committed", func(t *testing.T) {
		t.Parallel()
		s := newMemberSetup(t, map[kafkaclient.TopicPartition]workScript{
			part(0): {last: 10, until: "revoked t/0"},
			part(1): {batches: []int64{3}},
		})
		s.start(groupCall{kind: assign, parts: []kafkaclient.TopicPartition{part(0), part(1)}},
			groupCall{kind: revoke, parts: []kafkaclient.TopicPartition{part(0)}, after: "stored t/1@3"})
		s.requireEvent(t, "revoked t/0")
		s.flush()
		s.end()
		require.Equal(t, []string{
			"assigning t/0 t/1", "stored t/1@3",
			"revoking t/0", "stopping t/0", "stored t/0@10", "worker t/0 stopped", "commit t/0@10", "revoked t/0",
			"commit t/1@3",
			"revoking t/1", "stopping t/1", "worker t/1 stopped", "revoked t/1",
		}, s.list())
	})

	t.Run("a loss waits for the worker, and commits nothing of the partition in the ended generation", func(t *testing.T) {
		t.Parallel()
		s := newMemberSetup(t, map[kafkaclient.TopicPartition]workScript{
			part(0): {batches: []int64{10}, last: 12, until: "lost t/0"},
		})
		s.start(groupCall{kind: assign, parts: []kafkaclient.TopicPartition{part(0)}},
			groupCall{kind: lose, parts: []kafkaclient.TopicPartition{part(0)}, after: "stored t/0@10"})
		s.requireEvent(t, "lost t/0")
		require.False(t, s.m.health.inGroup.Load(), "partitions lost: the member is out of its group")
		s.flush()
		s.end()
		require.Equal(t, []string{
			"assigning t/0", "stored t/0@10",
			"losing t/0", "stopping t/0", "stored t/0@12", "worker t/0 stopped", "lost t/0",
		}, s.list())
	})

	t.Run("a partition assigned again while its run goes on keeps that run", func(t *testing.T) {
		t.Parallel()
		s := newMemberSetup(t, map[kafkaclient.TopicPartition]workScript{
			part(0): {batches: []int64{10}},
		})
		s.start(groupCall{kind: assign, parts: []kafkaclient.TopicPartition{part(0)}},
			groupCall{kind: assign, parts: []kafkaclient.TopicPartition{part(0)}, after: "stored t/0@10"})
		s.requireEventTimes(t, "assigning t/0", 2)
		require.True(t, s.m.health.inGroup.Load(), "assigned partitions: the member is in its group")
		s.end()
		require.Equal(t, []string{
			"assigning t/0", "stored t/0@10", "assigning t/0",
			"revoking t/0", "stopping t/0", "worker t/0 stopped", "commit t/0@10", "revoked t/0",
		}, s.list())
		require.Equal(t, int32(2), s.joins.Load(), "every assignment tells that the member is in its group")
	})
}
