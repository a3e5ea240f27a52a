package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// logView is what a partition's start is decided from: the stored
// position, the group's committed offset and the log's bounds.
type logView struct {
	pos    int64
	hasPos bool
	// storedTopic is the id of the topic pos counts in (zero: none
	// stored), topicID the id of the topic the bounds were read from
	// (zero: the broker gives none).
	storedTopic, topicID kafkaclient.TopicID
	committed            int64 // -1: none
	// committedMeta is the metadata committed with it: a commitmark.Mark
	// when kafkaonce committed it.
	committedMeta    string
	logStart, logEnd int64
	// stable is the last stable offset: logEnd, unless a transaction is
	// open, whose first record is then there.
	stable int64
}

// start is where the partition would start from v: the stored position
// when there is one (see assign), else the committed offset, else the log
// start or its last stable offset (see firstStart).
func (v logView) start(latest bool) int64 {
	switch {
	case v.hasPos:
		return v.pos
	case v.committed >= 0:
		return v.committed
	case latest:
		return v.stable
	}
	return v.logStart
}

// outside reports whether the log does not hold start: beyond its end, or
// below its start.
func (v logView) outside(start int64) bool { return start > v.logEnd || start < v.logStart }

// readLog reads the stored position and the log's bounds for assign.
//
// The fast path reads them at the same time: after a rebalance every
// partition starts at once, and the start is on the rebalance's clock. Two
// reads made at the same time can still be far apart: a process paused
// between them (SIGSTOP, a long GC, a VM migration) may read the log end
// before the pause and the stored position after it, when another member
// has moved the position on and the log has grown, and the position then
// lies beyond that old end. So when the fast reads put the start outside
// the log, they are read again one after the other, position first. The
// log end only grows, and a position is only stored for messages that were
// in the log, so an end read after the position is at least the position:
// the ordered reads disagree only when the log really is behind the
// position. (A log start read after the position may have passed it
// meanwhile; that is reported as a loss, the side to err on.)
func (w *worker) readLog(stop, work context.Context) (logView, error) {
	var v logView
	var boundsErr, committedErr error
	var kafkaReads sync.WaitGroup
	kafkaReads.Go(func() { boundsErr = v.readBounds(stop, w) })
	kafkaReads.Go(func() {
		var c kafkaclient.CommittedOffset
		c, committedErr = w.client.Committed(stop, kafkaclient.TopicPartition{Topic: w.topic, Partition: w.partition})
		v.committed, v.committedMeta = c.Offset, c.Metadata
	})
	posErr := v.readStored(work, w)
	kafkaReads.Wait()
	latest := w.cfg.StartOffset == kafkaoncetype.StartLatest
	if err := errors.Join(posErr, boundsErr, committedErr); err != nil || !v.outside(v.start(latest)) {
		return v, err
	}
	w.log.Info("the partition's start is outside the log's bounds read at the same time; reading them again, the stored position first",
		w.logAttrs(slog.Int64("offset", v.start(latest)), slog.Int64("log_start", v.logStart), slog.Int64("log_end", v.logEnd))...)
	return w.readLogInOrder(stop, work, v.committed, v.committedMeta)
}

// readLogInOrder reads the stored position, then the log's bounds.
func (w *worker) readLogInOrder(stop, work context.Context, committed int64, meta string) (v logView, err error) {
	v.committed, v.committedMeta = committed, meta
	if err := v.readStored(work, w); err != nil {
		return v, err
	}
	return v, v.readBounds(stop, w)
}

func (v *logView) readStored(ctx context.Context, w *worker) error {
	st, err := w.loadStored(ctx)
	v.pos, v.hasPos, v.storedTopic = st.Next, st.Found, storedTopic(st)
	return err
}

func (v *logView) readBounds(ctx context.Context, w *worker) error {
	b, err := w.client.Bounds(ctx, w.topic, w.partition)
	v.logStart, v.logEnd, v.stable, v.topicID = b.Start, b.End, b.Stable, b.TopicID
	return err
}

// processedPosition is the stored position, -1 when there is none: the
// fetcher reads it before the log bounds to tell a loss from messages
// another member processed before they were deleted.
func (w *worker) processedPosition(ctx context.Context) (int64, error) {
	pos, has, err := w.loadPosition(ctx)
	if err != nil || !has {
		return -1, err
	}
	return pos, nil
}
