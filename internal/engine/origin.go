package engine

import (
	"context"
	"log/slog"

	"github.com/kafkaonce/kafkaonce/internal/commitmark"
)

// The group's committed offset is a copy of the stored position, and each
// offset the consumer commits says so in its metadata: a commitmark.Mark
// naming the store, the consumer and the partition's first start (its
// origin). decideStart (start.go) reads the mark the group's offset
// carries at assignment; this file keeps the worker's own, and says what
// the mark told.

// setOrigin records where the partition's processing first started in
// this store (-1: not known), and the mark the worker's offsets carry from
// now on.
func (w *worker) setOrigin(first int64) {
	w.origin = first
	w.meta = commitmark.Mark{Store: w.storeID, Consumer: w.cfg.Name, First: first}.String()
}

// tellStart logs what the start plan p, made from v, has to say.
func (w *worker) tellStart(v logView, p startPlan) {
	switch p.note {
	case noteGroupBehind:
		w.log.Info("group offset is behind the stored position (rewound, or the last offset commit was lost); starting at the stored position, skipping messages already processed",
			w.logAttrs(slog.Int64("kafka_offset", v.committed), slog.Int64("stored_position", v.pos), slog.Int64("skipped", v.pos-v.committed))...)
	case noteGroupAhead:
		// The database does not have what Kafka says was processed: it
		// lost committed transactions (restored from a backup, failed
		// over to a lagging replica, asynchronous commit), and with them
		// the effects, the claims and the position, together. Processing
		// again from the stored position loses nothing and applies
		// nothing twice. (To skip messages on purpose, move the stored
		// position: kafkaonce replay does.)
		w.log.Warn("group offset is ahead of the stored position: the database is missing processed messages (restored from a backup? a failover to a lagging replica?); processing again from the stored position",
			w.logAttrs(slog.Int64("kafka_offset", v.committed), slog.Int64("stored_position", v.pos), slog.Int64("reprocessed", v.committed-v.pos))...)
	case noteLostRow:
		// Committed against a position this database stored, and no
		// longer has: the database lost the partition's rows, as it
		// loses a position behind the group offset, only wholly.
		// Trusting the group offset would pass over every message whose
		// effects went with them.
		m, _ := commitmark.Parse(v.committedMeta)
		w.log.Error("the partition has no stored position, but its group offset was committed by this consumer against a position this database stored: "+
			"the database lost the partition's rows (restored from a backup taken before its first start? a row deleted?), and with them the effects and claims of the messages below the group offset; processing again from the first start, the claims deciding what is a duplicate",
			w.logAttrs(slog.Int64("kafka_offset", v.committed), slog.Int64("first_start", m.First), slog.Int64("start", p.start), slog.Int64("log_start", v.logStart), slog.String("store", m.Store))...)
	case noteForeignMark:
		// Committed against another store (a consumer moved to a new
		// database, two databases sharing a group) or by another consumer
		// of this one (a renamed consumer), whose positions say nothing of
		// this consumer's here.
		m, _ := commitmark.Parse(v.committedMeta)
		why := "another database (another store_identity)"
		if m.Store == w.storeID {
			why = "another consumer name in this database"
		}
		w.log.Warn("the partition has no stored position; its group offset was committed by kafkaonce for "+why+", so it is adopted as any group offset is: processing starts there, and the messages below it are not this consumer's",
			w.logAttrs(slog.Int64("kafka_offset", v.committed), slog.String("committed_by_store", m.Store), slog.String("committed_by_consumer", m.Consumer),
				slog.String("store", w.storeID))...)
	}
}

// restartAfterLoss is where processing starts again when a batch finds the
// partition's stored position gone mid-run, for a partition whose first
// start was origin: the first start, since the database may have lost
// everything since (a restore to before it), with the claims deciding what
// was processed; or, when the worker does not know it (origin -1),
// fromLogStart (the log's start, read when the loss is found), as at an
// assignment that finds this consumer's mark without a first start. Where
// the run started would not do: the restore may have rolled back messages
// before it.
func restartAfterLoss(origin int64) int64 {
	if origin >= 0 {
		return origin
	}
	return fromLogStart
}

// fromLogStart is restartAfterLoss's answer when the first start is not
// known: processing starts again at the log's start.
const fromLogStart = -1

// lostRowRestart is where a worker whose stored position went missing
// mid-run goes on from (see restartAfterLoss): start, or the log's start
// when start is fromLogStart.
func (w *worker) lostRowRestart(stop context.Context, start int64) (int64, error) {
	if start != fromLogStart {
		return start, nil
	}
	b, err := w.client.Bounds(stop, w.topic, w.partition)
	if err != nil {
		return 0, err
	}
	logStart := b.Start
	w.log.Error("the partition's first start is not known (its position was stored before offsets carried it): processing again from the log's start, the claims deciding what is a duplicate",
		w.logAttrs(slog.Int64("log_start", logStart))...)
	return logStart, nil
}
