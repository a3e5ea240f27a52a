package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// membership is the engine's side of the consumer group: it starts a
// worker for each partition the client assigns, stops it when the
// partition is revoked or lost, and owns the committer that sends the
// workers' offsets. Partitions come and go one by one (a cooperative
// rebalance moves only those that change owner) or all at once (an eager
// one revokes everything): either way each partition's run is its own.
type membership struct {
	log    *slog.Logger
	health *health
	// grace is Config.ShutdownTimeout: how long a stopped worker's batch
	// in flight may run on (see partitionContexts).
	grace time.Duration
	// runCtx is Run's: cancelling it stops every worker, as a revocation
	// does.
	runCtx    context.Context
	committer *committer
	// group is the member's client, which Health asks who the member is.
	group kafkaclient.Group
	// work processes a partition for its run until stop is done, marking
	// its offsets with the committer: a worker (see newMembership), or a
	// test's script.
	work func(stop, work context.Context, r *partitionRun)
	// joined is called at every assignment: the member is in its group
	// (see recordWhenJoined).
	joined func()

	mu   sync.Mutex
	runs map[kafkaclient.TopicPartition]*partitionRun
	// all counts the workers still running, revoked or not.
	all sync.WaitGroup
}

// partitionRun is one worker's processing of one partition, from its
// assignment to its revocation. Its marks reach the committer only while it
// is the partition's current run: a worker abandoned, or still draining
// after its partition was lost, commits nothing.
type partitionRun struct {
	tp   kafkaclient.TopicPartition
	stop context.CancelFunc
	done chan struct{}
	// progress is the worker's, for Health.
	progress *progress
}

// newMembership returns the member of group that Run runs: a worker on d
// for each partition assigned, whose offsets are committed through group.
func newMembership(runCtx context.Context, d *deps, group kafkaclient.Group, joined func()) *membership {
	m := &membership{log: d.log, health: d.health, grace: d.cfg.ShutdownTimeout, runCtx: runCtx,
		group: group, committer: newCommitter(group, d.log, d.hooks.Committed), joined: joined, runs: map[kafkaclient.TopicPartition]*partitionRun{}}
	m.work = func(stop, work context.Context, r *partitionRun) {
		w := &worker{deps: d, committer: m.committer, hold: r, topic: r.tp.Topic, partition: r.tp.Partition, progress: r.progress}
		w.run(stop, work)
	}
	return m
}

// Assigned starts a worker for each partition.
func (m *membership) Assigned(_ context.Context, parts []kafkaclient.TopicPartition) {
	m.health.inGroup.Store(true)
	m.joined()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, tp := range parts {
		if old := m.runs[tp]; old != nil {
			// Assigned twice without a revocation between: the run in
			// progress goes on.
			m.log.Warn("consumer group: a partition was assigned again while it was being processed", slog.String("topic", tp.Topic), slog.Int("partition", tp.Partition))
			continue
		}
		stop, work, cancelStop, release := partitionContexts(m.runCtx, m.grace)
		r := &partitionRun{tp: tp, stop: cancelStop, done: make(chan struct{}), progress: newProgress()}
		m.runs[tp] = r
		m.committer.own(r)
		m.all.Add(1)
		go func() {
			defer m.all.Done()
			defer close(r.done)
			defer release()
			m.work(stop, work, r)
		}()
	}
	if len(parts) > 0 {
		m.log.Info("consumer group: partitions assigned", slog.Int("partitions", len(parts)), slog.Int("processing", len(m.runs)))
	}
}

// Revoked stops the partitions' workers, waits for them to finish the
// batch they are in (within ShutdownTimeout), and commits their last
// offsets before the member gives the partitions up.
func (m *membership) Revoked(ctx context.Context, parts []kafkaclient.TopicPartition) {
	runs := m.take(parts)
	for _, r := range runs {
		r.stop()
	}
	for _, r := range runs {
		<-r.done
	}
	m.committer.release(ctx, runs, true)
	m.log.Info("consumer group: partitions revoked", slog.Int("partitions", len(runs)))
}

// Lost stops the partitions' workers and waits for them. Nothing is
// committed: the member is out of the generation that owned them, and
// their new owners start from the stored positions.
func (m *membership) Lost(ctx context.Context, parts []kafkaclient.TopicPartition) {
	m.health.outSince.Store(time.Now().UnixNano())
	m.health.inGroup.Store(false)
	runs := m.take(parts)
	m.committer.release(ctx, runs, false)
	for _, r := range runs {
		r.stop()
	}
	for _, r := range runs {
		<-r.done
	}
	m.log.Warn("consumer group: partitions lost (this member's session ended); their new owners resume from the stored positions", slog.Int("partitions", len(runs)))
}

// take removes the runs of parts.
func (m *membership) take(parts []kafkaclient.TopicPartition) []*partitionRun {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*partitionRun
	for _, tp := range parts {
		if r := m.runs[tp]; r != nil {
			delete(m.runs, tp)
			out = append(out, r)
		}
	}
	return out
}

// partitionContexts derives a worker's two contexts:
//
//   - stop is done when the partition is revoked (cancelStop) or Run's
//     context is cancelled (shutdown): stop fetching, do not start another
//     batch;
//   - work is done grace after stop: it bounds the batch in flight. It does
//     not inherit Run's cancellation, so a shutdown lets the batch finish.
//
// release, once the worker returned, frees both.
func partitionContexts(runCtx context.Context, grace time.Duration) (stop, work context.Context, cancelStop, release func()) {
	stop, cancelStop = context.WithCancel(runCtx)
	work, cancelWork := context.WithCancel(context.WithoutCancel(runCtx))
	var timer *time.Timer
	var mu sync.Mutex
	unlinkStop := context.AfterFunc(stop, func() {
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(grace, cancelWork)
	})
	return stop, work, cancelStop, func() {
		unlinkStop()
		cancelStop()
		cancelWork()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}
}
