package engine

import (
	"context"
	"log/slog"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// reportHeld reports a partition held back by a transaction left open, and
// the end of that: logs, HookPartitionHeld, and the partition's run record,
// where kafkaonce status and serve show it.
func (w *worker) reportHeld(ctx context.Context, h kafkaclient.Held) {
	held := kafkaoncetype.PartitionHeld{Topic: h.Topic, Partition: h.Partition, Offset: h.At, LogEnd: h.End, Since: h.Since, Released: h.Released}
	if h.Released {
		w.log.Info("the transaction that held the partition back has ended", w.logAttrs(slog.Int64("offset", h.At), slog.Duration("held_for", time.Since(h.Since)))...)
	} else {
		w.log.Warn("an open transaction holds the partition back: nothing at or after its first record is processed until its producer commits or aborts it (or the broker aborts it at the transaction timeout)",
			w.logAttrs(slog.Int64("offset", h.At), slog.Int64("log_end", h.End), slog.Time("since", h.Since))...)
	}
	w.recordHeld(ctx, h)
	for _, hook := range w.hooks.Held {
		hook(ctx, held)
	}
}

// recordHeld writes the wait, or its end, on the partition's run record,
// where operators in other processes see it. The log and the hooks have it
// already: a failure to record it is only logged.
func (w *worker) recordHeld(ctx context.Context, h kafkaclient.Held) {
	if !w.started {
		return
	}
	at := h.At
	if h.Released {
		at = -1
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := w.attempts.Held(ctx, w.db, w.cfg.Name, w.topic, w.partition, w.runID, at, h.Since); err != nil {
		w.log.Warn("could not record the partition's wait on an open transaction for operators", w.logAttrs(slog.String("error", err.Error()))...)
	}
}
