package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
)

// item is a message of the batch being processed, with what is derived from
// it before the transaction.
type item struct {
	msg Message
	fp  dedupe.Fingerprint
}

// fate is what a transaction did with one message.
type fate uint8

const (
	fateApplied fate = iota
	fateSkipped
	fateSkippedInBatch
)

// batchState holds per-transaction buffers, reused across batches.
type batchState struct {
	claims  []dedupe.Claim
	claimed []bool
	fates   []fate
}

// processBatch converts a fetched batch, derives its message ids and
// applies the messages up to the first one without a valid id; that one
// stops the partition.
func (w *worker) processBatch(stop, work context.Context, raw []kafka.Message) error {
	items := w.items[:0]
	var idErr error
	for i := range raw {
		items = append(items, item{msg: Message{
			Topic:     raw[i].Topic,
			Partition: raw[i].Partition,
			Offset:    raw[i].Offset,
			Key:       raw[i].Key,
			Value:     raw[i].Value,
			Headers:   raw[i].Headers,
			Time:      raw[i].Time,
		}})
		it := &items[len(items)-1]
		id, err := messageID(w.c.cfg.MessageID, &it.msg)
		if err != nil {
			items = items[:len(items)-1]
			idErr = err
			break
		}
		it.msg.ID = id
		it.fp = dedupe.FingerprintOf(it.msg.Key, it.msg.Value)
	}
	w.items = items
	if err := w.apply(stop, work, items); err != nil {
		return err
	}
	if idErr != nil && work.Err() == nil {
		return &PartitionError{Topic: w.topic, Partition: w.partition, Err: idErr}
	}
	return nil
}

// apply commits items in order, in as few transactions as it can.
//
// One transaction covers the whole batch. When message k fails, that
// transaction rolls back; the messages before k are committed in a
// transaction of their own (they did nothing wrong), then k is retried
// alone, with backoff, and the rest follow as a batch once k succeeds. So a
// failure neither re-applies nor drops its neighbours, and the partition
// stays in order.
//
// Failures of the infrastructure (connection lost, COMMIT outcome unknown,
// serialisation failures, deadlocks) retry the same transaction after a
// backoff. A permanent failure stops the partition at its message.
func (w *worker) apply(stop, work context.Context, items []item) error {
	backoff := w.c.retry.New()
	attempt := 1
	alone := false // items[0] failed before and runs by itself
	limit := 0     // when > 0, the next transaction covers items[:limit]
	// permanent remembers a permanent failure found behind a prefix, so that
	// the failing message is not run again once the prefix has committed.
	var permanent *txOutcome
	var permanentAt int64
	for len(items) > 0 {
		if alone && permanent != nil && items[0].msg.Offset == permanentAt {
			return w.stopAt(permanent)
		}
		n := len(items)
		switch {
		case alone:
			n = 1
		case limit > 0:
			n = limit
		}
		out := w.runTx(work, items[:n], attempt)
		if out.err == nil {
			w.afterCommit(work, items[:n])
			items = items[n:]
			// After a prefix, the message that failed behind it is next and
			// runs alone; it has already failed once.
			alone, attempt = limit > 0, 1
			if alone {
				attempt = 2
			}
			limit = 0
			backoff.Reset()
			continue
		}
		if work.Err() != nil {
			// The shutdown grace ran out mid-transaction: it rolled back (or
			// its COMMIT outcome is unknown); either way the next owner of
			// the partition finds the truth in the claims.
			return work.Err()
		}
		if out.failedAt > 0 {
			// Commit the messages before the failing one first.
			limit = out.failedAt
			if out.class == classPermanent {
				permanent, permanentAt = &out, items[out.failedAt].msg.Offset
			}
			continue
		}
		if out.failedAt == 0 {
			if out.class == classPermanent {
				return w.stopAt(&out)
			}
			alone, limit = true, 0
		}
		w.c.log.Warn("batch failed; retrying", w.logAttrs(
			slog.Int64("offset", items[0].msg.Offset), slog.String("message_id", out.messageID(items)),
			slog.Int("attempt", attempt), slog.String("class", out.class.String()), slog.String("error", out.err.Error()))...)
		attempt++
		if retry.Sleep(stop, backoff.Next()) != nil {
			// Revoked or shutting down: leave the message to the next owner.
			return nil
		}
	}
	return nil
}

func (w *worker) stopAt(out *txOutcome) error {
	return &PartitionError{Topic: w.topic, Partition: w.partition, Err: out.err}
}

// txOutcome is the result of one batch transaction: all of it committed
// (err nil), or none of it.
type txOutcome struct {
	err error
	// failedAt is the index of the message that failed, or -1 when the
	// transaction as a whole failed (infrastructure).
	failedAt int
	class    errClass
}

func (o *txOutcome) messageID(items []item) string {
	if o.failedAt >= 0 && o.failedAt < len(items) {
		return items[o.failedAt].msg.ID
	}
	return items[0].msg.ID
}

// runTx runs one transaction over items, between the batch hooks.
func (w *worker) runTx(ctx context.Context, items []item, attempt int) txOutcome {
	info := BatchInfo{Topic: w.topic, Partition: w.partition, FirstOffset: items[0].msg.Offset,
		LastOffset: items[len(items)-1].msg.Offset, Size: len(items), Attempt: attempt}
	for _, h := range w.c.hooks.start {
		h.OnBatchStart(ctx, info)
	}
	began := time.Now()
	out := w.tx(ctx, items)
	if len(w.c.hooks.end) > 0 {
		r := BatchResult{Duration: time.Since(began), Err: out.err}
		if out.err == nil {
			for _, f := range w.batch.fates[:len(items)] {
				if f == fateApplied {
					r.Applied++
				} else {
					r.Skipped++
				}
			}
		}
		for _, h := range w.c.hooks.end {
			h.OnBatchEnd(ctx, info, r)
		}
	}
	return out
}

// tx claims the ids of items, runs the handler for each newly claimed one,
// advances the stored position past the last item and commits.
func (w *worker) tx(ctx context.Context, items []item) (out txOutcome) {
	out.failedAt = -1
	st := &w.batch
	st.claims = st.claims[:0]
	for i := range items {
		st.claims = append(st.claims, dedupe.Claim{MessageID: items[i].msg.ID, Fingerprint: items[i].fp, Offset: items[i].msg.Offset})
	}
	st.claimed = resize(st.claimed, len(items))
	st.fates = resize(st.fates, len(items))

	tx, err := w.c.db.Begin(ctx)
	if err != nil {
		return infra(fmt.Errorf("begin: %w", err))
	}
	committed := false
	defer func() {
		if !committed {
			// Rollback on a broken connection fails too; pgx then closes the
			// connection and the pool replaces it.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()

	b := &pgx.Batch{}
	if w.c.sessionSQL != "" {
		b.Queue(w.c.sessionSQL, w.c.sessionArgs...)
	}
	w.c.claims.QueueClaim(b, w.c.cfg.Name, w.topic, w.partition, st.claims, st.claimed)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return infra(fmt.Errorf("claim: %w", err))
	}

	if res := w.resolveUnclaimed(ctx, tx, items); res.err != nil {
		return res
	}

	gtx := txguard.Wrap(tx)
	for i := range items {
		if st.fates[i] != fateApplied {
			continue
		}
		err := w.callHandler(ctx, gtx, &items[i].msg)
		if err == nil && gtx.Misused() {
			err = ErrTxControlledByConsumer
		}
		if err != nil {
			merr := &MessageError{Topic: w.topic, Partition: w.partition, Offset: items[i].msg.Offset, MessageID: items[i].msg.ID, Err: err}
			cls := classify(err)
			if cls == classInfra {
				// A deadlock or a lost connection inside the handler is not
				// the message's fault: the whole batch runs again.
				return txOutcome{failedAt: -1, class: cls, err: merr}
			}
			return txOutcome{failedAt: i, class: cls, err: merr}
		}
	}

	if err := w.c.offsets.Advance(ctx, tx, w.c.cfg.Name, w.topic, w.partition, items[len(items)-1].msg.Offset+1); err != nil {
		return infra(err)
	}
	if err := tx.Commit(ctx); err != nil {
		committed = true // nothing left to roll back: the connection is gone or the server ended the transaction
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			// The server answered: the transaction did not commit.
			return infra(fmt.Errorf("commit: %w", err))
		}
		// No answer: the COMMIT may or may not have been applied. Never
		// guess (pgconn.SafeToRetry says nothing about a COMMIT that was
		// sent): leave the Kafka offset alone and run the batch again on a
		// new connection, where the claims tell which it was.
		w.c.log.Warn("COMMIT outcome unknown; the batch will run again and its claims decide", w.logAttrs(
			slog.Int64("offset", items[0].msg.Offset), slog.String("error", err.Error()))...)
		return infra(fmt.Errorf("commit outcome unknown: %w", err))
	}
	committed = true
	return out
}

// resolveUnclaimed sorts the messages whose claim found an existing row into
// duplicates (same fingerprint: skip) and conflicts (different fingerprint:
// fail the message).
func (w *worker) resolveUnclaimed(ctx context.Context, tx pgx.Tx, items []item) txOutcome {
	st := &w.batch
	var ids []string
	for i := range items {
		if st.claimed[i] {
			st.fates[i] = fateApplied
		} else {
			ids = append(ids, items[i].msg.ID)
		}
	}
	if len(ids) == 0 {
		return txOutcome{failedAt: -1}
	}
	// A new statement sees rows committed by other transactions since the
	// claim (READ COMMITTED), and rows this transaction just inserted for an
	// earlier copy in the same batch.
	existing, err := w.c.claims.Lookup(ctx, tx, w.c.cfg.Name, ids)
	if err != nil {
		return infra(err)
	}
	for i := range items {
		if st.claimed[i] {
			continue
		}
		rec, ok := existing[items[i].msg.ID]
		if !ok {
			// Deleted between the claim and the lookup (pruning): run again.
			return infra(fmt.Errorf("claim of message id %q vanished during the batch", items[i].msg.ID))
		}
		inBatch := rec.Topic == w.topic && rec.Partition == w.partition && w.claimedHere(items, rec.Offset)
		if rec.Fingerprint != items[i].fp {
			if inBatch {
				rec.Status = "" // the first copy is not stored yet
			}
			return txOutcome{failedAt: i, class: classPermanent, err: &FingerprintConflictError{
				Topic: w.topic, Partition: w.partition, Offset: items[i].msg.Offset, MessageID: items[i].msg.ID,
				Fingerprint: items[i].fp, Existing: rec}}
		}
		st.fates[i] = fateSkipped
		if inBatch {
			st.fates[i] = fateSkippedInBatch
		}
	}
	return txOutcome{failedAt: -1}
}

// claimedHere reports whether this transaction claimed the message at off.
func (w *worker) claimedHere(items []item, off int64) bool {
	for i := range items {
		if items[i].msg.Offset == off {
			return w.batch.claimed[i]
		}
	}
	return false
}

// callHandler runs the handler, turning a panic into an error that keeps
// the stack: one bad message must not crash every partition of the process.
func (w *worker) callHandler(ctx context.Context, tx pgx.Tx, msg *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrHandlerPanicked, r, debug.Stack())
		}
	}()
	return w.c.cfg.Handler.Handle(ctx, tx, msg)
}

// afterCommit reports the committed messages and hands their offset to the
// Kafka committer. This is the only path to an offset commit, and it runs
// only after the database commit succeeded.
func (w *worker) afterCommit(ctx context.Context, items []item) {
	for i := range items {
		switch w.batch.fates[i] {
		case fateApplied:
			for _, h := range w.c.hooks.applied {
				h.OnMessageApplied(ctx, &items[i].msg)
			}
		case fateSkipped:
			for _, h := range w.c.hooks.skipped {
				h.OnMessageSkipped(ctx, &items[i].msg, SkipAlreadyClaimed)
			}
		case fateSkippedInBatch:
			for _, h := range w.c.hooks.skipped {
				h.OnMessageSkipped(ctx, &items[i].msg, SkipDuplicateInBatch)
			}
		}
	}
	w.next = items[len(items)-1].msg.Offset + 1
	w.committer.mark(w.topic, w.partition, w.next)
}

func infra(err error) txOutcome {
	return txOutcome{failedAt: -1, class: classInfra, err: err}
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
