package engine

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// mark hands next to the committer, with the worker's mark.
func (w *worker) mark(next int64) {
	w.committer.mark(w.hold, next, w.meta)
	// The offset goes first; what follows is Health's bookkeeping: the
	// worker moved, and Postgres answered (a batch committed, or a first
	// start was stored).
	w.progress.step()
	w.health.committed.Store(time.Now().UnixNano())
}

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
	deadLettered, applied := false, false
	for i := range items {
		switch st.fates[i] {
		case fateApplied:
			for _, h := range w.hooks.Applied {
				h(ctx, &items[i].msg)
			}
			applied = true
		case fateSkipped, fateSkippedInBatch, fateSkippedSuspect:
			reason := kafkaoncetype.SkipAlreadyClaimed
			switch st.fates[i] {
			case fateSkippedInBatch:
				reason = kafkaoncetype.SkipDuplicateInBatch
			case fateSkippedSuspect:
				reason = kafkaoncetype.SkipSuspectDuplicate
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
			attrs := w.logAttrs(slog.Int64("offset", items[i].msg.Offset),
				slog.String("message_id", items[i].msg.ID), slog.String("class", string(f.kind)), slog.Int("attempt", f.attempts),
				slog.String("error", f.err.Error()))
			if f.kind == deadletter.ClassRetryLater {
				w.log.Info("message set aside, to be retried later", append(attrs, slog.Duration("retry_after", f.retryAfter))...)
			} else {
				w.log.Error("message set aside in dead_letters", attrs...)
			}
			for _, h := range w.hooks.Dead {
				h(ctx, &items[i].msg, kafkaoncetype.DeadLettered{Class: f.kind, Err: f.err, Attempts: f.attempts})
			}
		}
	}
	if p.clearAttempts && last >= w.attemptsUpTo {
		w.attemptsUpTo = -1
	}
	if deadLettered {
		w.wakePublisher()
	}
	if applied && w.breaker != nil { // no clock read nor pause lookup per batch without one
		w.breaker.applied(w.topic, time.Now(), w.pausedNow())
	}
	w.next, w.positionKnown = items[len(items)-1].end, true
	w.mark(w.next)
	w.reportLag(ctx)
	if !w.topicStored && !w.topicID.IsZero() {
		// The batch created the position (it had gone missing): it
		// carries no topic id until this one is stored. A failure leaves
		// it to the next batch.
		if err := w.storeTopic(ctx); err != nil {
			w.log.Warn("could not store the topic id with the position; trying again after the next batch", w.logAttrs(slog.String("error", err.Error()))...)
		}
	}
}

// committer commits processed offsets to Kafka for the member. Workers
// mark a partition's next offset only after the database transaction that
// processed the messages below it committed; the committer sends the latest
// mark of every partition in one offset commit, so a busy partition costs
// at most one commit per batch and usually fewer.
//
// It keeps only the marks of the partitions' current runs (see
// partitionRun): a worker that was abandoned, or whose partition was lost
// and may be another member's by now, marks in vain. Commits go through
// the member's generation, so the broker rejects them once the member has
// been fenced out of the group.
//
// The Kafka offset is only a copy of the processed position stored in
// Postgres; a lost or rejected commit costs a redelivery that the stored
// position skips, never a duplicate effect. Each offset carries its run's
// mark (see commitmark), which says it is that copy: a partition that has
// lost its stored position can tell so from the group's offset.
type committer struct {
	// group is the member the commits go through, in its generation.
	group kafkaclient.Group
	log   *slog.Logger
	// hooks are Hooks.Committed, told of every commit and its result.
	hooks []func(context.Context, []kafkaoncetype.TopicPartitionOffset, error)
	wake  chan struct{}
	// flushing is held while a commit is in flight: a partition released
	// waits for it, so that no commit of its offsets lands after its new
	// owner's.
	flushing sync.Mutex

	mu      sync.Mutex
	owned   map[kafkaclient.TopicPartition]*partitionRun
	pending map[kafkaclient.TopicPartition]kafkaclient.Offset
}

// commitTimeout bounds one offset commit.
const commitTimeout = 10 * time.Second

func newCommitter(group kafkaclient.Group, log *slog.Logger, hooks []func(context.Context, []kafkaoncetype.TopicPartitionOffset, error)) *committer {
	return &committer{group: group, log: log, hooks: hooks, wake: make(chan struct{}, 1),
		owned: map[kafkaclient.TopicPartition]*partitionRun{}, pending: map[kafkaclient.TopicPartition]kafkaclient.Offset{}}
}

// own makes r its partition's current run.
func (m *committer) own(r *partitionRun) {
	m.mu.Lock()
	m.owned[r.tp] = r
	m.mu.Unlock()
}

// mark records that every message of r's partition below next is durably
// processed, if r is the partition's current run; meta is committed with
// the offset. A mark at the same offset with other metadata replaces the
// pending one: it is how a run brings the group offset's mark up to date.
func (m *committer) mark(r *partitionRun, next int64, meta string) {
	m.mu.Lock()
	if m.owned[r.tp] != r {
		m.mu.Unlock()
		return
	}
	// Without a pending mark, any is taken: offset 0 too (a first start
	// where the log begins), which the zero value would pass over.
	if p, ok := m.pending[r.tp]; !ok || next > p.Next || next == p.Next && meta != p.Metadata {
		m.pending[r.tp] = kafkaclient.Offset{TopicPartition: r.tp, Next: next, Metadata: meta}
	}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// release ends runs: with commit, their pending marks are committed first
// (once: if that fails, the partitions' next owners start from the stored
// positions all the same); without, they are dropped. Either way no mark
// of theirs is committed after release returns.
func (m *committer) release(ctx context.Context, runs []*partitionRun, commit bool) {
	m.flushing.Lock()
	defer m.flushing.Unlock()
	m.mu.Lock()
	final := map[kafkaclient.TopicPartition]kafkaclient.Offset{}
	for _, r := range runs {
		if m.owned[r.tp] != r {
			continue
		}
		if off, ok := m.pending[r.tp]; ok && commit {
			final[r.tp] = off
		}
		delete(m.owned, r.tp)
		delete(m.pending, r.tp)
	}
	m.mu.Unlock()
	if len(final) > 0 {
		m.commit(ctx, final, false)
	}
}

// run commits marks as they come, and retries failed commits every second,
// until ctx is done.
func (m *committer) run(ctx context.Context) {
	retryTick := time.NewTicker(time.Second)
	defer retryTick.Stop()
	for {
		select {
		case <-m.wake:
		case <-retryTick.C:
		case <-ctx.Done():
			return
		}
		m.flush(ctx)
	}
}

func (m *committer) flush(ctx context.Context) {
	m.flushing.Lock()
	defer m.flushing.Unlock()
	m.mu.Lock()
	if len(m.pending) == 0 {
		m.mu.Unlock()
		return
	}
	batch := m.pending
	m.pending = map[kafkaclient.TopicPartition]kafkaclient.Offset{}
	m.mu.Unlock()
	m.commit(ctx, batch, true)
}

// commit sends batch. On a failure that is not the generation's end, with
// retry, the marks go back to be committed on the next tick (unless newer
// ones came), without waking the loop: a broker that refuses commits is
// not hammered.
func (m *committer) commit(ctx context.Context, batch map[kafkaclient.TopicPartition]kafkaclient.Offset, retry bool) {
	list := make([]kafkaclient.Offset, 0, len(batch))
	for _, o := range batch {
		list = append(list, o)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	err := m.group.Commit(cctx, list)
	cancel()
	if len(m.hooks) > 0 {
		reported := flatten(list)
		for _, h := range m.hooks {
			h(ctx, reported, err)
		}
	}
	if err == nil {
		return
	}
	if errors.Is(err, kafkaclient.ErrFenced) {
		// The generation is over for this member: the new owner of each
		// partition starts from the stored position, so nothing is lost by
		// dropping these marks.
		m.log.Info("kafka offset commit rejected: this member's generation has ended", slog.String("error", err.Error()))
		return
	}
	if !retry {
		m.log.Warn("kafka offset commit of revoked partitions failed; their next owners start from the stored positions", slog.String("error", err.Error()))
		return
	}
	// Partitions of a topic the broker no longer knows (deleted, or
	// created again under a new id) cannot be committed again: their
	// marks are dropped, the stored positions decide, and their workers
	// stop on the new topic (ErrTopicRecreated) or are revoked.
	var gone *kafkaclient.TopicGoneError
	if errors.As(err, &gone) {
		for _, tp := range gone.Partitions {
			delete(batch, tp)
		}
		m.log.Warn("kafka offset commit refused: the broker does not know the partitions' topic (deleted or re-created); not retrying them, the stored positions stand",
			slog.Int("partitions", len(gone.Partitions)), slog.String("error", gone.Error()))
		if len(batch) == 0 {
			return
		}
	}
	m.log.Warn("kafka offset commit failed; retrying within a second", slog.String("error", err.Error()))
	m.mu.Lock()
	for tp, off := range batch {
		if cur, ok := m.pending[tp]; m.owned[tp] != nil && (!ok || off.Next > cur.Next) {
			m.pending[tp] = off
		}
	}
	m.mu.Unlock()
}

func flatten(list []kafkaclient.Offset) []kafkaoncetype.TopicPartitionOffset {
	out := make([]kafkaoncetype.TopicPartitionOffset, len(list))
	for i, o := range list {
		out[i] = kafkaoncetype.TopicPartitionOffset{Topic: o.Topic, Partition: o.Partition, Offset: o.Next}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out
}
