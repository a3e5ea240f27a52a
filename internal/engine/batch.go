package engine

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/recent"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// errInterrupted is returned when the partition was revoked or the consumer
// is shutting down while a message waited for a retry: the message is left
// to the next owner.
var errInterrupted = errors.New("consumer: interrupted by revocation or shutdown")

// item is a message of the batch being processed, with what is derived from
// it before the transaction.
type item struct {
	msg kafkaoncetype.Message
	// end is where the partition's position moves once the message is
	// processed: the offset after it, or after the transaction markers
	// right behind it.
	end int64
	fp  dedupe.Fingerprint
	// idErr is set when no valid id could be derived; the message is set
	// aside as invalid.
	idErr error
	// suspect is the earlier sighting of the same content under another
	// id, for a suspect duplicate.
	suspect *recent.Sighting
	// repeatOf is the offset of the first copy of this message (same id,
	// same content) this worker saw, or -1. Below the worker's position,
	// that copy is committed: this one is a re-send (see resent).
	repeatOf int64
}

// resent reports whether it is, most likely, a re-send of a message this
// worker already committed: the same id and content were first seen below
// next, the position of the batches committed so far. Only a prediction,
// which the database checks (see oneTrip).
func (it *item) resent(next int64) bool { return it.repeatOf >= 0 && it.repeatOf < next }

// firstCopyInBatch returns the index of the earlier message of items that
// items[i] repeats (the same id and content, further back in the same
// batch), or -1.
func firstCopyInBatch(items []item, i int) int {
	r := items[i].repeatOf
	if r < items[0].msg.Offset || r >= items[i].msg.Offset {
		return -1
	}
	j := sort.Search(i, func(k int) bool { return items[k].msg.Offset >= r })
	if j < i && items[j].msg.Offset == r && items[j].msg.ID == items[i].msg.ID && items[j].fp == items[i].fp {
		return j
	}
	return -1
}

// foreseen reports whether items[i] was known for a duplicate before its
// claim: a re-send of a committed message, or a repeat within the batch.
func foreseen(items []item, i int, next int64) bool {
	return items[i].resent(next) || firstCopyInBatch(items, i) >= 0
}

// processBatch converts a fetched batch, derives its message ids and
// applies it. Under StopPartition, a message without a valid id ends the
// batch and stops the partition once the messages before it are applied.
func (w *worker) processBatch(stop, work context.Context, raw []kafkaclient.Record) error {
	items := w.items[:0]
	var stopErr error
	now := time.Now() // one clock reading per batch for the suspect check
	for i := range raw {
		items = append(items, item{repeatOf: -1, end: max(raw[i].Next, raw[i].Offset+1), msg: kafkaoncetype.Message{
			Topic:     raw[i].Topic,
			Partition: raw[i].Partition,
			Offset:    raw[i].Offset,
			Key:       raw[i].Key,
			Value:     raw[i].Value,
			Headers:   raw[i].Headers,
			Time:      raw[i].Time,
		}})
		it := &items[len(items)-1]
		id, err := w.user.id(&it.msg)
		if err != nil {
			if w.cfg.OnPermanentFailure == kafkaoncetype.StopPartition {
				w.reportFailure(work, &it.msg, invalidIDFailure(err))
				items = items[:len(items)-1]
				stopErr = &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition, Err: err}
				break
			}
			it.idErr = err
			continue
		}
		it.msg.ID = id
		it.fp = dedupe.FingerprintOf(it.msg.Key, it.msg.Value)
		if w.recent != nil {
			prev, suspect, repeatOf := w.recent.ObserveRepeat(it.fp, id, it.msg.Offset, now)
			it.repeatOf = repeatOf
			if suspect {
				// A copy: taking prev's own address would put it on the
				// heap for every message, suspect or not.
				sighting := prev
				it.suspect = &sighting
				w.reportSuspect(work, &it.msg, prev)
			}
		}
	}
	w.items = items
	if len(raw) > 0 {
		w.hwm = raw[len(raw)-1].HighWaterMark
		w.sawEnd(w.hwm)
	}

	// After a run that did not get past this point, go one message at a
	// time, counting attempts, until past the suspect batch.
	for len(items) > 0 && items[0].msg.Offset < w.carefulUntil {
		if err := w.runAlone(stop, work, items[:1], nil); err != nil {
			return err
		}
		items = items[1:]
	}
	if err := w.apply(stop, work, items); err != nil {
		return err
	}
	return stopErr
}

// plan says what one transaction does with a run of items.
type plan struct {
	// n means the transaction covers items[:n].
	n int
	// savepointFrom means handlers of items[savepointFrom:] run inside a
	// savepoint, so that after a failure earlier in the batch a failing
	// message can be set aside without losing its neighbours.
	savepointFrom int
	// deadLetter holds the messages to set aside without running the handler, by
	// index.
	deadLetter map[int]*failure
	// after is a failure of the message right after items[:n], to resolve
	// once they are committed.
	after *failure
	// clearAttempts says to remove the attempt rows of the committed messages.
	clearAttempts bool
	// provisional holds the offsets of a share group's records whose
	// provisional letters (see shareMember.writeProvisional) the
	// transaction removes when it commits them. Read only.
	provisional map[int64]bool
}

// newPlan covers all of items in one plain transaction, setting aside those
// without a valid id.
func (w *worker) newPlan(items []item) plan {
	p := plan{n: len(items), savepointFrom: len(items)}
	for i := range items {
		if items[i].idErr != nil {
			if p.deadLetter == nil {
				p.deadLetter = map[int]*failure{}
			}
			p.deadLetter[i] = invalidIDFailure(items[i].idErr)
		}
	}
	if len(items) > 0 && w.attemptsUpTo >= items[0].msg.Offset {
		p.clearAttempts = true
	}
	return p
}

// apply commits items in order, in as few transactions as it can.
//
// One transaction covers the whole batch. When message k fails, that
// transaction rolls back, and:
//
//   - if the failure is permanent, the batch runs again with k set aside
//     (dead-lettered in the same transaction) and every handler after k in a
//     savepoint, so further poison messages are set aside without rolling
//     back their neighbours;
//   - if it may pass, the messages before k are committed in a transaction
//     of their own, then k is retried alone (runAlone), then the rest follow
//     as a batch.
//
// So a failure neither re-applies nor drops its neighbours, and the
// partition stays in order. Failures of the infrastructure (connection lost,
// COMMIT outcome unknown) run the same transaction again after a backoff. A
// transaction that lost a race for rows (a deadlock, a serialization
// failure) runs again soon over fewer messages, and a transaction covers no
// more than the partition's pace allows (see contention.go).
func (w *worker) apply(stop, work context.Context, items []item) error {
	attempt := 1
	// Up to this offset, messages go one per transaction: a COMMIT over
	// several of them was refused for their content.
	oneByOneTo := int64(-1)
	next := func() plan {
		p := w.newPlan(items)
		if len(items) > 0 && items[0].msg.Offset <= oneByOneTo {
			p.n = 1
		}
		p.n = min(p.n, w.pace.Limit(w.gate.Serialized(time.Now())))
		return p
	}
	p := next()
	l := w.newLadder()
	for len(items) > 0 {
		out, err := l.step(work, items, &p, attempt)
		if err != nil {
			return err
		}
		items = items[out.committed:]
		switch out.kind {
		case succeeded:
			if p.after != nil {
				if err := w.resolve(stop, work, items[:1], p.after); err != nil {
					return err
				}
				items = items[1:]
			}
			p, attempt = next(), 1
		case isolate:
			// Not an attempt of any message: which one failed is not known
			// yet. The same messages run again, one per call, each in a
			// savepoint.
			w.log.Debug("batch handler failed; handling the batch one message at a time", w.logAttrs(
				slog.Int64("offset", items[0].msg.Offset), slog.String("error", out.err.Error()))...)
			p.savepointFrom = 0
		case oneByOne:
			w.log.Warn("the server refused to commit a batch for what its handlers wrote; applying its messages one per transaction to find which", w.logAttrs(
				slog.Int64("offset", items[0].msg.Offset), slog.String("error", out.err.Error()))...)
			oneByOneTo = items[p.n-1].msg.Offset
			p = next()
		case messageFailed:
			// failedAt counts from the start of the transaction; what it
			// committed is gone from items.
			var resolved bool
			if items, resolved, err = w.messageFailed(stop, work, items, &p, &out); err != nil {
				return err
			}
			if resolved {
				p, attempt = next(), 1
			}
		default:
			// The transaction failed as a whole (ladder.step ended the run
			// for a lost position or a stopped partition). After a lost
			// race the same messages run first, fewer of them: the failure
			// after the smaller plan, if any, is found again when it is
			// reached.
			if limit := w.pace.Limit(w.gate.Serialized(time.Now())); out.kind == lostRace && p.n > limit {
				p.n, p.after = limit, nil
			}
			if out.kind != gateBusy {
				attempt++
			}
			if err := l.again(stop, items[0].msg.Offset, "batch", &out); err != nil {
				return err
			}
		}
	}
	return nil
}

// messageFailed deals with the message out says failed in a transaction
// over items per p: a permanent failure is set aside in the next try of
// the same transaction; otherwise the messages before it are committed
// first, and it is resolved on its own. It returns what is left of items,
// and whether the message was resolved (the caller then plans anew).
func (w *worker) messageFailed(stop, work context.Context, items []item, p *plan, out *txOutcome) (rest []item, resolved bool, err error) {
	if !out.fail.uncounted {
		w.reportFailure(work, &items[out.failedAt-out.committed].msg, out.fail)
	}
	if out.committed > 0 {
		// A savepoint transaction was cut short at the failing message,
		// which is now items[0].
		if err := w.resolve(stop, work, items[:1], out.fail); err != nil {
			return nil, false, err
		}
		return items[1:], true, nil
	}
	if p.afterFailure(out.failedAt, out.fail, w.cfg.OnPermanentFailure == kafkaoncetype.DeadLetter) {
		if err := w.resolve(stop, work, items[:1], out.fail); err != nil {
			return nil, false, err
		}
		return items[1:], true, nil
	}
	return items, false, nil
}

// afterFailure changes p after the message at k failed with f in a
// transaction that committed nothing, and reports whether that message,
// the first, is to be resolved on its own instead. A permanent failure
// that may be set aside is, in the next try of the same transaction, with
// every handler after it in a savepoint; otherwise the messages before it
// are committed first, and it is resolved after them (p.after).
func (p *plan) afterFailure(k int, f *failure, deadLetter bool) (alone bool) {
	switch {
	case f.class == classPermanent && deadLetter:
		if p.deadLetter == nil {
			p.deadLetter = map[int]*failure{}
		}
		p.deadLetter[k] = f
		p.savepointFrom = min(p.savepointFrom, k+1)
	case k == 0:
		return true
	default:
		p.n, p.after = k, f
	}
	return false
}

// resolve deals with a message whose attempt failed: set aside at once when
// the failure is permanent, else retried alone (as if it had not failed
// yet, when the failure does not count).
func (w *worker) resolve(stop, work context.Context, one []item, f *failure) error {
	switch {
	case f.class == classPermanent:
		return w.setAside(stop, work, one, f)
	case f.uncounted:
		return w.runAlone(stop, work, one, nil)
	}
	return w.runAlone(stop, work, one, f)
}

// reportSuspect logs a suspect duplicate and calls its hooks.
func (w *worker) reportSuspect(ctx context.Context, msg *kafkaoncetype.Message, first recent.Sighting) {
	w.log.Warn("suspect duplicate: the same content was seen shortly before under another id (a producer that makes a new id on each retry?)",
		w.logAttrs(slog.Int64("offset", msg.Offset), slog.String("message_id", msg.ID),
			slog.String("first_message_id", first.MessageID), slog.Int64("first_offset", first.Offset))...)
	for _, h := range w.hooks.Suspect {
		h(ctx, msg, kafkaoncetype.SuspectOf{MessageID: first.MessageID, Offset: first.Offset, At: first.At})
	}
}

// reportFailure logs a failed attempt and calls the failure hooks.
func (w *worker) reportFailure(ctx context.Context, msg *kafkaoncetype.Message, f *failure) {
	later := f.kind == deadletter.ClassRetryLater
	if later {
		// Asked for (RetryLater) or the policy's: expected, and retried.
		w.log.Info("message failed; setting it aside to retry later", w.logAttrs(slog.Int64("offset", msg.Offset), slog.String("message_id", msg.ID),
			slog.String("class", string(f.kind)), slog.Duration("retry_after", f.retryAfter), slog.String("error", f.err.Error()))...)
	} else {
		w.log.Warn("message failed", w.logAttrs(slog.Int64("offset", msg.Offset), slog.String("message_id", msg.ID),
			slog.Int("attempt", f.attempts), slog.String("class", f.class.String()), slog.String("error", f.err.Error()))...)
	}
	for _, h := range w.hooks.Failed {
		h(ctx, msg, kafkaoncetype.Failure{Err: f.err, Class: f.kind, Attempt: max(f.attempts, 1), Permanent: f.class == classPermanent && !later})
	}
	w.breakerFailed(ctx, msg, f)
}
