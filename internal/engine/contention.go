package engine

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/internal/pace"
	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
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
// consumer pass one at a time, in the order they came. The wait is bounded
// by pace.GateWait: a turn at the gate is short, so a longer wait means
// the holder is stuck (a slow or hung handler, a row locked outside the
// consumer), and the partition races its next transaction instead of
// queueing behind it (see gateBusyError).
//
// The wait runs under timeouts of its own (lock_timeout GateWait, no
// statement_timeout, which could otherwise end it first, as a failure that
// is not the gate's); the ones in effect before it, whatever set them (the
// consumer's settings, the pool's connections, the role), are read first
// into t and put back after it (see afterGate).
func (c *database) queueGate(b *pgx.Batch, t *timeouts) {
	b.Queue("SELECT current_setting('lock_timeout'), current_setting('statement_timeout')").QueryRow(func(row pgx.Row) error {
		return row.Scan(&t.lock, &t.statement)
	})
	b.Queue("SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', '0', true)", gateWait)
	b.Queue("SELECT pg_advisory_xact_lock($1::int4, $2::int4)", int32(gateClass), c.gateKey)
}

var gateWait = fmt.Sprintf("%dms", pace.GateWait.Milliseconds())

// timeouts are a transaction's lock and statement timeouts, as
// current_setting shows them.
type timeouts struct{ lock, statement string }

// afterGate returns b after the statement that puts the timeouts back to
// what they were before the wait at the gate.
func afterGate(b *pgx.Batch, t *timeouts) *pgx.Batch {
	restore := &pgx.Batch{}
	restore.Queue("SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)", t.lock, t.statement)
	restore.QueuedQueries = append(restore.QueuedQueries, b.QueuedQueries...)
	return restore
}

// gateBusyError means the gate was not free within pace.GateWait. Not a lost
// race for rows: the batch keeps its size, and the partition's
// transactions race for pace.GateBypass (see worker.raceUntil).
type gateBusyError struct{ err error }

func (e *gateBusyError) Error() string {
	return "the consumer's gate was held longer than " + gateWait + ": racing instead: " + e.err.Error()
}

func (e *gateBusyError) Unwrap() error { return e.err }

// raceLockTimeout is the lock_timeout of a racing transaction: at most
// pace.RaceLockTimeout, and never longer than the configured LockTimeout.
// A transaction of one message needs none: with its locks taken in a
// stable order, any deadlock it is part of also holds a transaction of
// several messages, whose timeout breaks it (or one outside the consumer,
// which Postgres breaks).
func raceLockTimeout(cfg *Config) time.Duration {
	if cfg.LockTimeout != kafkaoncetype.LeaveUnset {
		return min(pace.RaceLockTimeout, cfg.LockTimeout)
	}
	return pace.RaceLockTimeout
}

// paceNow says how a transaction starting now runs: whether it takes the
// consumer's gate (not while the partition races after a long wait for
// it), the partition's batch limit, and what of the pace to write to the
// run's record with it.
func (w *worker) paceNow() (serialized bool, limit int, row *attempts.Pace) {
	serialized = w.serializedNow() && !time.Now().Before(w.raceUntil)
	return serialized, w.pace.Limit(serialized), w.paceRow(serialized)
}

// serializedNow reports whether a transaction starting now takes the gate,
// and logs when the partition starts or stops racing.
func (w *worker) serializedNow() bool {
	s := w.gate.Serialized(time.Now())
	if w.wasSerialized && !s {
		w.log.Info("contention: this partition's transactions race the consumer's others again", w.logAttrs(
			slog.Int("batch_limit", w.pace.Limit(false)))...)
	}
	w.wasSerialized = s
	return s
}

// paced updates the partition's pace after a transaction over info's
// messages, and reports a lost race.
func (w *worker) paced(ctx context.Context, info kafkaoncetype.BatchInfo, out *txOutcome, took time.Duration) {
	switch {
	case out.kind == lostRace:
		entered := w.pace.Contended(info.Size, info.Serialized, time.Now())
		serialized := w.gate.Serialized(time.Now())
		limit := w.pace.Limit(serialized)
		w.log.Debug("contention: the transaction lost a race for rows; retrying with a smaller batch", w.logAttrs(
			slog.Int64("offset", info.FirstOffset), slog.Int("messages", info.Size), slog.Int("batch_limit", limit),
			slog.String("error", out.err.Error()))...)
		if entered {
			w.log.Info("contention: the consumer's transactions take turns for a while instead of racing each other", w.logAttrs(
				slog.Time("until", w.gate.Until()), slog.Int("batch_limit", limit), slog.String("error", out.err.Error()))...)
		}
		c := kafkaoncetype.Contention{Err: out.err, BatchLimit: limit, Serialized: serialized}
		for _, h := range w.hooks.Contention {
			h(ctx, info, c)
		}
	case out.kind == gateBusy:
		w.log.Debug("contention: the consumer's gate is held too long (a slow handler, a row locked elsewhere); the next transaction races", w.logAttrs(
			slog.Int64("offset", info.FirstOffset))...)
	case out.committed > 0:
		w.pace.Committed(out.committed, took, out.held)
	}
}

// paceRow is what partition_runs should show of the partition's pace, or
// nil when it shows that already: written only once the partition lost a
// race, and then only when something changed, in the transaction that
// commits the next batch. serialized is whether that transaction takes the
// gate.
func (w *worker) paceRow(serialized bool) *attempts.Pace {
	if w.pace.Retries() == 0 {
		return nil
	}
	row := attempts.Pace{Run: w.runID, BatchLimit: w.pace.Limit(serialized), ContentionRetries: w.pace.Retries(),
		LastContention: w.pace.LastContention(), SerializedUntil: w.gate.Until()}
	if row == w.paceShown {
		return nil
	}
	return &row
}

// stuckAfter is how many transactions in a row, from the same message, lose
// races before the partition warns: contention is retried for ever (it is
// never the message's fault), so a row another transaction keeps locked
// must be visible without debug logs.
const stuckAfter = 50

// warnIfStuck warns, every stuckAfter lost races, that the partition has
// not got past offset since.
func (w *worker) warnIfStuck(offset int64, lost int, err error) {
	if lost%stuckAfter == 0 {
		w.log.Warn("contention: the partition keeps losing races for rows at this offset; is a transaction outside the consumer holding them?", w.logAttrs(
			slog.Int64("offset", offset), slog.Int("lost", lost), slog.Int("batch_limit", w.pace.Limit(w.wasSerialized)), slog.String("error", err.Error()))...)
	}
}

// raceMayHaveFailed marks f uncounted when it may be this racing
// transaction's own lock timeout in disguise: a transient failure with no
// SQLSTATE to read (the handler wrapped the error without %w) after which
// the server holds the transaction aborted, so a statement failed. Outside the race, alone,
// the message waits for its locks for the whole LockTimeout; only failures
// there count. A handler failing for a reason of its own, with no failed
// statement, fails as it always did.
func (a *txAttempt) raceMayHaveFailed(tx pgx.Tx, f *failure) {
	var pgErr *pgconn.PgError
	if !a.racing || f.class != classTransient || errors.As(f.err, &pgErr) {
		// Not racing, or not a failure that may pass, or one whose
		// SQLSTATE is known (and is not contention): it counts.
		return
	}
	if conn := tx.Conn(); conn != nil && conn.PgConn().TxStatus() == 'E' {
		f.uncounted = true
	}
}
