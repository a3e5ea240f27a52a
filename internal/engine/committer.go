package engine

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/segmentio/kafka-go"
)

// afterCommit reports the committed messages and hands their offset to the
// Kafka committer. This is the only path to an offset commit, and it runs
// only after the database commit succeeded.
func (w *worker) afterCommit(ctx context.Context, items []item, p *plan, st *batchState) {
	last := items[len(items)-1].msg.Offset
	for _, cf := range st.conflicts {
		if cf.Offset > last {
			// Behind where a savepoint transaction was cut: not set aside
			// yet (the next transaction does, and reports it).
			continue
		}
		w.log.Error("message id reused for different content; the message was set aside", w.logAttrs(
			slog.Int64("offset", cf.Offset), slog.String("message_id", cf.MessageID), slog.String("error", cf.Error()))...)
		for _, h := range w.hooks.Conflict {
			h(ctx, cf)
		}
	}
	for _, i := range st.failedInTx {
		w.reportFailure(ctx, &items[i].msg, st.fails[i])
	}
	deadLettered := false
	for i := range items {
		switch st.fates[i] {
		case fateApplied:
			for _, h := range w.hooks.Applied {
				h(ctx, &items[i].msg)
			}
		case fateSkipped, fateSkippedInBatch, fateSkippedSuspect:
			reason := SkipAlreadyClaimed
			switch st.fates[i] {
			case fateSkippedInBatch:
				reason = SkipDuplicateInBatch
			case fateSkippedSuspect:
				reason = SkipSuspectDuplicate
			}
			for _, h := range w.hooks.Skipped {
				h(ctx, &items[i].msg, reason)
			}
		case fateDeadLettered:
			deadLettered = true
			f := st.fails[i]
			if f.kind == deadletter.ClassInvalidID || f.kind == deadletter.ClassConflict {
				// Failures found without calling the handler: reported
				// here, once, as the handler's are where they happen.
				w.reportFailure(ctx, &items[i].msg, f)
			}
			w.log.Error("message set aside in dead_letters", w.logAttrs(slog.Int64("offset", items[i].msg.Offset),
				slog.String("message_id", items[i].msg.ID), slog.String("class", string(f.kind)), slog.Int("attempt", f.attempts),
				slog.String("error", f.err.Error()))...)
			for _, h := range w.hooks.Dead {
				h(ctx, &items[i].msg, DeadLettered{Class: f.kind, Err: f.err, Attempts: f.attempts})
			}
		}
	}
	if p.clearAttempts && last >= w.attemptsUpTo {
		w.attemptsUpTo = -1
	}
	if deadLettered {
		w.wakePublisher()
	}
	w.next, w.positionKnown = last+1, true
	w.committer.mark(w.topic, w.partition, w.next)
}

// committer commits processed offsets to Kafka for one generation. Workers
// mark a partition's next offset only after the database transaction that
// processed the messages below it committed; the committer sends the latest
// mark of every partition in one OffsetCommit request, so a busy partition
// costs at most one commit per batch and usually fewer.
//
// Commits go through the generation (its id and member id), so the broker
// rejects them once this member has been fenced out of the group: a zombie
// cannot move offsets of partitions it no longer owns.
//
// The Kafka offset is only a copy of the processed position stored in
// Postgres; a lost or rejected commit costs a redelivery that the stored
// position skips, never a duplicate effect.
type committer struct {
	*deps
	gen *kafka.Generation

	mu      sync.Mutex
	pending map[string]map[int]int64
	wake    chan struct{}
}

func newCommitter(c *Consumer, gen *kafka.Generation) *committer {
	return &committer{deps: c.deps, gen: gen, pending: map[string]map[int]int64{}, wake: make(chan struct{}, 1)}
}

// mark records that every message of topic/partition below next is
// durably processed.
func (m *committer) mark(topic string, partition int, next int64) {
	m.mu.Lock()
	ps := m.pending[topic]
	if ps == nil {
		ps = map[int]int64{}
		m.pending[topic] = ps
	}
	if next > ps[partition] {
		ps[partition] = next
	}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run commits marks as they come until stop is done, then until all workers
// have returned (they finish their batches and mark them), then commits what
// is left and returns.
//
// run must not return before stop is done, even when this member has no
// partition: kafka-go ends this member's generation as soon as any function
// started with gen.Start returns, and the member then joins again, which
// rebalances the whole group. A member with nothing to do that returned at
// once would make the group rebalance without end.
func (m *committer) run(stop context.Context, workers *sync.WaitGroup) {
	retryTick := time.NewTicker(time.Second)
	defer retryTick.Stop()
	m.commitUntil(stop, stop.Done(), retryTick.C)
	workersDone := make(chan struct{})
	go func() { workers.Wait(); close(workersDone) }()
	m.commitUntil(stop, workersDone, retryTick.C)
	m.flush(stop)
}

// commitUntil commits marks as they come, and retries failed commits on
// each tick, until done is closed.
func (m *committer) commitUntil(ctx context.Context, done <-chan struct{}, tick <-chan time.Time) {
	for {
		select {
		case <-m.wake:
			m.flush(ctx)
		case <-tick:
			m.flush(ctx)
		case <-done:
			return
		}
	}
}

func (m *committer) flush(ctx context.Context) {
	m.mu.Lock()
	if len(m.pending) == 0 {
		m.mu.Unlock()
		return
	}
	batch := m.pending
	m.pending = map[string]map[int]int64{}
	m.mu.Unlock()

	err := m.gen.CommitOffsets(batch)
	if len(m.hooks.Committed) > 0 {
		list := flatten(batch)
		for _, h := range m.hooks.Committed {
			h(ctx, list, err)
		}
	}
	if err == nil {
		return
	}
	if fenced(err) {
		// The generation is over for this member: the new owner of each
		// partition starts from the stored position, so nothing is lost by
		// dropping these marks.
		m.log.Info("kafka offset commit rejected: this member's generation has ended", slog.Int("generation", int(m.gen.ID)), slog.String("error", err.Error()))
		return
	}
	m.log.Warn("kafka offset commit failed; retrying within a second", slog.String("error", err.Error()))
	// Put the marks back without waking the loop: the retry ticker paces
	// the next attempt, so a broker that refuses commits is not hammered.
	m.mu.Lock()
	for topic, ps := range batch {
		for p, off := range ps {
			if m.pending[topic] == nil {
				m.pending[topic] = map[int]int64{}
			}
			if off > m.pending[topic][p] {
				m.pending[topic][p] = off
			}
		}
	}
	m.mu.Unlock()
}

// fenced reports errors that mean this member can no longer commit in this
// generation.
func fenced(err error) bool {
	return errors.Is(err, kafka.IllegalGeneration) ||
		errors.Is(err, kafka.UnknownMemberId) ||
		errors.Is(err, kafka.RebalanceInProgress) ||
		errors.Is(err, kafka.FencedInstanceID)
}

func flatten(m map[string]map[int]int64) []TopicPartitionOffset {
	var out []TopicPartitionOffset
	for topic, ps := range m {
		for p, off := range ps {
			out = append(out, TopicPartitionOffset{Topic: topic, Partition: p, Offset: off})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}
