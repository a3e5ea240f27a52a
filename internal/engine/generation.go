package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// startGeneration starts one worker per assigned partition and the offset
// committer, all bound to the generation: kafka-go waits for every function
// started with gen.Start to return before it joins the next generation or
// leaves the group, and keeps the generation's coordinator connection open
// until then, so the workers' final offset commits still go out through this
// generation. Since any of them returning ends the member's generation and
// so rebalances the group, none returns before the generation ends or Run is
// cancelled, not even the committer of a member that was assigned no
// partition.
func (c *Consumer) startGeneration(runCtx context.Context, gen *kafka.Generation, all *sync.WaitGroup) {
	committer := newCommitter(c, gen)
	var workers sync.WaitGroup
	assigned := 0
	for topic, parts := range gen.Assignments {
		for _, pa := range parts {
			assigned++
			workers.Add(1)
			all.Add(1)
			w := &worker{deps: c.deps, committer: committer, topic: topic, partition: pa.ID, kafkaOffset: pa.Offset}
			gen.Start(func(genCtx context.Context) {
				defer all.Done()
				defer workers.Done()
				stop, work, release := generationContexts(runCtx, genCtx, c.cfg.ShutdownTimeout)
				defer release()
				w.run(stop, work)
			})
		}
	}
	c.log.Info("consumer group: generation started", slog.Int("generation", int(gen.ID)), slog.String("member", gen.MemberID), slog.Int("partitions", assigned))
	all.Add(1)
	gen.Start(func(genCtx context.Context) {
		defer all.Done()
		stop, _, release := generationContexts(runCtx, genCtx, 0)
		defer release()
		committer.run(stop, &workers)
	})
}

// generationContexts derives a worker's two contexts:
//
//   - stop is done when the generation ends (revocation) or Run's context is
//     cancelled (shutdown): stop fetching, do not start another batch;
//   - work is done grace after stop: it bounds the batch in flight. It does
//     not inherit Run's cancellation, so a shutdown lets the batch finish.
func generationContexts(runCtx, genCtx context.Context, grace time.Duration) (stop, work context.Context, release func()) {
	stop, cancelStop := context.WithCancel(genCtx)
	unlinkRun := context.AfterFunc(runCtx, cancelStop)
	work, cancelWork := context.WithCancel(context.WithoutCancel(runCtx))
	var timer *time.Timer
	var mu sync.Mutex
	unlinkStop := context.AfterFunc(stop, func() {
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(grace, cancelWork)
	})
	return stop, work, func() {
		unlinkStop()
		unlinkRun()
		cancelStop()
		cancelWork()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
	}
}
