package consumer

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/internal/retry"
)

// How a partition's transactions adapt when they lose races for rows to
// other transactions is internal/pace's business: a smaller batch after
// each loss, and for a while a turn at the consumer's gate instead of a
// race. This file connects it to the worker: it tells contention from
// other failures, takes the gate, reports, and waits briefly before the
// retry.

// isContention reports errors of a transaction that lost a race for rows
// to another one: a deadlock, a serialization failure, a lock wait that
// ran out (lock_timeout). None is the message's fault, and the same
// transaction run again later may well pass.
func isContention(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "40001", // serialization_failure
		"40P01", // deadlock_detected
		"55P03": // lock_not_available
		return true
	}
	return false
}

// contentionWaits are the waits before a transaction that lost a race runs
// again: short and jittered, so that the partitions that collided do not
// collide again in step, and a partition does not sit idle while others
// commit.
var contentionWaits = retry.Policy{Initial: 5 * time.Millisecond, Max: 200 * time.Millisecond}

// gateClass is the first key of the gate's advisory lock (the
// two-integer form, whose keys never meet the one-bigint form's); the
// second is a hash of the schema and the consumer's name (see gateKey).
const gateClass = 0x6b6f6e63 // "konc"

// gateKey is the second key of the consumer's gate: one per consumer and
// schema, shared by its members in every process.
func gateKey(schemaName, name string) int32 {
	h := fnv.New32a()
	h.Write([]byte(schemaName))
	h.Write([]byte{0})
	h.Write([]byte(name))
	return int32(h.Sum32())
}

// queueGate adds to b, first thing in a transaction, the wait for the
// consumer's gate: a transaction-scoped advisory lock, released when the
// transaction ends, however it ends. Serialized transactions of the
// consumer pass one at a time, in the order they came.
func (c *Consumer) queueGate(b *pgx.Batch) {
	b.Queue("SELECT pg_advisory_xact_lock($1::int4, $2::int4)", int32(gateClass), c.gate)
}

// serializedNow reports whether a transaction starting now takes the gate,
// and logs when the partition starts or stops racing.
func (w *worker) serializedNow() bool {
	s := w.pace.Serialized(time.Now())
	if w.wasSerialized && !s {
		w.c.log.Info("contention: this partition's transactions race the others again", w.logAttrs(
			slog.Int("batch_limit", w.pace.Limit()))...)
	}
	w.wasSerialized = s
	return s
}

// paced updates the partition's pace after a transaction over info's
// messages that took took, and reports a lost race.
func (w *worker) paced(ctx context.Context, info BatchInfo, out *txOutcome, took time.Duration) {
	switch {
	case out.contention:
		entered := w.pace.Contended(info.Size, info.Serialized, time.Now())
		w.c.log.Debug("contention: the transaction lost a race for rows; retrying with a smaller batch", w.logAttrs(
			slog.Int64("offset", info.FirstOffset), slog.Int("messages", info.Size), slog.Int("batch_limit", w.pace.Limit()),
			slog.String("error", out.err.Error()))...)
		if entered {
			w.c.log.Info("contention: this partition's transactions wait their turn behind the consumer's others for a while", w.logAttrs(
				slog.Time("until", w.pace.SerializedUntil()), slog.Int("batch_limit", w.pace.Limit()), slog.String("error", out.err.Error()))...)
		}
		c := Contention{Err: out.err, BatchLimit: w.pace.Limit(), Serialized: w.pace.Serialized(time.Now())}
		for _, h := range w.c.hooks.contention {
			h.OnContention(ctx, info, c)
		}
	case out.committed > 0:
		w.pace.Committed(out.committed, info.Serialized, took)
	}
}

// paceRow is what partition_runs should show of the partition's pace, or
// nil when it shows that already: written only after contention, and only
// when something changed, in the transaction that commits the next batch.
func (w *worker) paceRow() *attempts.Pace {
	row := attempts.Pace{Run: w.runID, BatchLimit: w.pace.Limit(), ContentionRetries: w.pace.Retries(),
		LastContention: w.pace.LastContention(), SerializedUntil: w.pace.SerializedUntil()}
	if row == w.paceShown {
		return nil
	}
	return &row
}

// queuePace adds to b the write of the partition's pace to its run's
// record, when there is something new to show.
func (a *txAttempt) queuePace(b *pgx.Batch) {
	if a.paceRow != nil {
		a.c.attempts.QueuePace(b, a.c.cfg.Name, a.topic, a.partition, *a.paceRow)
	}
}

// waitToRetry waits before a transaction of the message at offset, which
// failed as a whole (what says what it did), runs again: briefly after a
// lost race, else after the next of the infrastructure's backoff, with a
// warning.
func (w *worker) waitToRetry(stop context.Context, offset int64, what string, out *txOutcome, backoff, short *retry.Backoff) error {
	wait := short
	if !out.contention {
		w.c.log.Warn(what+" failed; retrying", w.logAttrs(slog.Int64("offset", offset),
			slog.String("class", classInfra.String()), slog.String("error", out.err.Error()))...)
		wait = backoff
	}
	if retry.Sleep(stop, wait.Next()) != nil {
		return errInterrupted
	}
	return nil
}
