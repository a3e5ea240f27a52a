package engine

import (
	"context"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// lagView is what a partition's lag is reported from: the log end the
// worker last saw, and what it last reported.
type lagView struct {
	// end is the log's end as last seen (set once seen is): a fetch's
	// high watermark, or the last stable offset read while the partition
	// was idle.
	end  int64
	seen bool
	// shownAt and shownEnd are the position and end of the last report,
	// if shown.
	shownAt, shownEnd int64
	shown             bool
}

// sawEnd records a log end the worker saw; the next report uses it.
func (w *worker) sawEnd(end int64) {
	if end >= 0 {
		w.lag.end, w.lag.seen = end, true
	}
}

// reportLag tells the lag hooks where the partition stands, when its
// position or the end seen moved since the last report. The position is
// w.next, which passes transaction markers and aborted records once they
// are read: an idle partition of a transactional topic reports 0.
func (w *worker) reportLag(ctx context.Context) {
	if len(w.hooks.Lag) == 0 || !w.lag.seen || w.lag.shown && w.next == w.lag.shownAt && w.lag.end == w.lag.shownEnd {
		return
	}
	w.lag.shownAt, w.lag.shownEnd, w.lag.shown = w.next, w.lag.end, true
	l := kafkaoncetype.PartitionLag{Topic: w.topic, Partition: w.partition, Position: w.next, LogEnd: w.lag.end, Lag: max(w.lag.end-w.next, 0)}
	for _, h := range w.hooks.Lag {
		h(ctx, l)
	}
}
