package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/retry"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// shareRun is what applyShare knows of one partition's records of a poll
// while it works through them.
type shareRun struct {
	recs  []kafkaclient.ShareRecord
	items []item
	// isolated: the BatchHandler failed over several messages, and each
	// now gets a call of its own, in a savepoint. failed: a Handler call
	// failed, and every call now runs in a savepoint. oneByOne: the server
	// refused a COMMIT over several for their content, and each now gets
	// a transaction of its own.
	isolated, failed, oneByOne bool
	// tries counts each record's failed attempts in this delivery;
	// setAside holds the failure of each record to set aside, by offset.
	tries    map[int64]int
	setAside map[int64]*failure
	// provisional holds the offsets of the records on their last delivery
	// whose provisional letters committed (see writeProvisional): each
	// transaction that settles one of them removes its letter.
	provisional map[int64]bool
}

// applyShare applies one partition's records of a poll, and settles each
// once the transaction that decided it committed: accepted when applied or
// found claimed, rejected when set aside in dead_letters. It reuses the
// consumer group's transaction (txAttempt, claim first) in its positionless
// mode: once a handler failed, every handler call in a savepoint (a
// BatchHandler's after it failed over several), so one failing message is
// set aside or cut off without undoing the others. Retries happen in place, while the records' locks
// are renewed: a share group's broker has no backoff of its own, and a
// release would count a delivery against the record.
//
// It returns an error only when the member must stop: the consumer's own
// closing statements were refused for their data (the stopped outcome),
// as they would be again on every delivery, by every member. A consumer
// group stops the partition there; a share group has no partition of the
// member's own, so the member stops, Run returns the error, and the
// records go back to the group unsettled (see runShare).
func (s *shareMember) applyShare(stop, work context.Context, recs []kafkaclient.ShareRecord) error {
	r := &shareRun{recs: recs, items: s.shareItems(recs), tries: map[int64]int{}, setAside: map[int64]*failure{}}
	if !s.writeProvisional(stop, work, r) {
		return nil // the rest is released (see run)
	}
	infraBackoff := s.retry.New()
	attempt := 1
	for len(r.items) > 0 {
		if stop.Err() != nil {
			return nil // the rest is released (see run)
		}
		if s.dropLost(work, r); len(r.items) == 0 {
			return nil
		}
		p := r.plan(s.cfg.HandleBatch != nil)
		out := s.batch(work, r, &p, attempt)
		r.recs, r.items = r.recs[out.committed:], r.items[out.committed:]
		if out.committed > 0 {
			attempt = 1
		}
		switch out.kind {
		case succeeded:
			if out.committed == 0 {
				return nil // nothing left to do
			}
			infraBackoff.Reset()
		case isolate:
			s.log.Debug("batch handler failed; handling the records one at a time", s.shareAttrs(&r.recs[0], slog.String("error", out.err.Error()))...)
			r.isolated = true
		case oneByOne:
			s.log.Warn("the server refused to commit records for what their handlers wrote; applying them one per transaction to find which",
				s.shareAttrs(&r.recs[0], slog.String("error", out.err.Error()))...)
			r.oneByOne = true
		case messageFailed:
			r.failed = true
			if !s.shareFailed(stop, r, out.failedAt-out.committed, out.fail) {
				return nil
			}
		case stopped:
			// Released, the records would come back, to this member or
			// another, and be refused the same way until the broker
			// archived them at their delivery limit; set aside, they would
			// be refused too (the set-aside is what was refused, see
			// handlersFailed). An operator must look.
			s.log.Error("the consumer's own statements were refused, and would be again; the share group member stops",
				s.shareAttrs(&r.recs[0], slog.String("error", out.err.Error()))...)
			return out.err
		default:
			// The database failed, not a record: the same transaction
			// again after a backoff, counting no attempt, the locks
			// renewed meanwhile.
			attempt++
			s.log.Warn("share transaction failed; trying again", s.shareAttrs(&r.recs[0], slog.String("error", out.err.Error()))...)
			if retry.Sleep(stop, infraBackoff.Next()) != nil {
				return nil
			}
		}
	}
	return nil
}

// dropLost stops work on the records of r whose locks this member lost
// (see shareLocks.lostLocks), before another transaction, retry or
// set-aside starts on them, and says so. A transaction already running
// over them was let finish: its COMMIT is safe, since a member that took
// the record meanwhile meets it on the claim, and one of them applies it.
// But a member that goes on retrying, or sets aside, records it no longer
// holds works against the member that does hold them, and spends handler
// calls (a partner's, often) on records it cannot settle. They are
// released: refused when the lock is gone already, given back at once
// when the broker merely refused the renewal. A record on its last
// delivery keeps its provisional letter, removed by whoever settles it.
func (s *shareMember) dropLost(work context.Context, r *shareRun) {
	ids := make([]kafkaclient.RecordID, len(r.recs))
	for i := range r.recs {
		ids[i] = r.recs[i].RecordID
	}
	lost := s.locks.lostLocks(ids)
	if len(lost) == 0 {
		return
	}
	var recs []kafkaclient.ShareRecord
	var items []item
	var gone []kafkaclient.RecordID
	for i := range r.recs {
		if lost[r.recs[i].RecordID] {
			gone = append(gone, r.recs[i].RecordID)
			s.log.Error("lost the lock of a record: no longer working on it; the member holding it now applies it, or finds its claim",
				s.shareAttrs(&r.recs[i], slog.String("message_id", r.items[i].msg.ID))...)
			s.shareEvent(work, kafkaoncetype.ShareLockLost, r.recs[i].RecordID, nil)
			continue
		}
		recs, items = append(recs, r.recs[i]), append(items, r.items[i])
	}
	r.recs, r.items = recs, items
	s.locks.settle(work, kafkaclient.Release, gone...)
}

// shareItems turns records into the engine's items, their ids derived.
func (s *shareMember) shareItems(recs []kafkaclient.ShareRecord) []item {
	items := make([]item, len(recs))
	for i := range recs {
		r := &recs[i]
		items[i] = item{repeatOf: -1, end: r.Offset + 1, msg: kafkaoncetype.Message{
			Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Headers: r.Headers, Time: r.Time,
		}}
		it := &items[i]
		id, err := s.user.id(&it.msg)
		if err != nil {
			it.idErr = err
			continue
		}
		it.msg.ID = id
		it.fp = dedupe.FingerprintOf(it.msg.Key, it.msg.Value)
	}
	return items
}

// plan is the next transaction over the run's records: all of them (one
// with oneByOne), those to set aside marked, and no savepoint until a
// handler failed (a savepoint costs a round trip per call): then every
// call runs in one, so that a failing record is set aside or cut off
// without undoing the others.
func (r *shareRun) plan(batched bool) plan {
	p := plan{n: len(r.items), savepointFrom: len(r.items), provisional: r.provisional}
	if batched && r.isolated || !batched && r.failed {
		p.savepointFrom = 0
	}
	if r.oneByOne {
		p.n = 1
	}
	for i := range r.items[:p.n] {
		f := r.setAside[r.items[i].msg.Offset]
		if r.items[i].idErr != nil {
			f = invalidIDFailure(r.items[i].idErr)
		}
		if f != nil {
			if p.deadLetter == nil {
				p.deadLetter = map[int]*failure{}
			}
			p.deadLetter[i] = f
		}
	}
	return p
}

// writeProvisional writes, in a transaction of its own that commits
// before any handler runs, the dead letter of each record of r on its
// last delivery, marked provisional: a record whose handler kills the
// process on its last delivery is archived by the broker without a word,
// and this letter is then all that is left of it, whole, with the
// delivery it was on, open to redrive like any other. The transaction
// that settles the record removes it (see txAttempt.close); a record set
// aside then gets its final letter in its place. Database failures are
// retried until stop; it reports false when stop ended it first.
//
// Only the last delivery gets one: a record whose earlier delivery dies
// with its process is delivered again, and meets this on its last. The
// cost is a transaction per poll and partition holding a record on its
// last delivery, which is a record that failed every delivery before, or
// every record when the group's limit is 1.
func (s *shareMember) writeProvisional(stop, work context.Context, r *shareRun) bool {
	var letters []deadletter.Letter
	var offsets []int64
	for i := range r.recs {
		rec := &r.recs[i]
		if !s.lastDelivery(rec) {
			continue
		}
		f := newFailure(classPermanent, deadletter.ClassCrashed, fmt.Errorf(
			"share group delivery %d of %d did not finish: the process, or its connection to Postgres, died while the handler ran, or the member stopped before it settled the record; the broker archives a record after its last delivery",
			rec.DeliveryCount, s.settings.DeliveryLimit))
		f.attempts = rec.DeliveryCount
		letters = append(letters, letterFor(&r.items[i], f))
		offsets = append(offsets, rec.Offset)
	}
	if len(letters) == 0 {
		return true
	}
	first := &r.recs[0]
	b := &pgx.Batch{}
	if err := s.letters.QueueInsertProvisional(b, s.cfg.Name, first.Topic, first.Partition, letters); err != nil {
		// Only headers that do not encode: the records are set aside as
		// they are, without a provisional letter.
		s.log.Error("could not write the provisional letters of records on their last delivery", s.shareAttrs(first, slog.String("error", err.Error()))...)
		return true
	}
	backoff := s.retry.New()
	for {
		err := s.inTx(work, func(q querier) error {
			for _, qq := range b.QueuedQueries {
				if _, err := q.Exec(work, qq.SQL, qq.Arguments...); err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			break
		}
		s.log.Warn("could not write the provisional letters of records on their last delivery; trying again", s.shareAttrs(first, slog.String("error", err.Error()))...)
		if retry.Sleep(stop, backoff.Next()) != nil {
			return false
		}
	}
	r.provisional = map[int64]bool{}
	for _, off := range offsets {
		r.provisional[off] = true
	}
	for i := range r.recs {
		if r.provisional[r.recs[i].Offset] {
			s.shareEvent(work, kafkaoncetype.ShareProvisionalWritten, r.recs[i].RecordID, nil)
		}
	}
	s.log.Info("records on their last delivery: provisional letters written before their handlers run", s.shareAttrs(first, slog.Int("records", len(offsets)))...)
	return true
}

// shareFailed deals with the record at k whose handler failed with f in a
// transaction that did not commit it, and reports whether to go on: a
// permanent failure, a transient one past MaxAttempts (or past the retry
// policy's time), and any failure on the record's last delivery set the
// record aside in the next transaction; otherwise it is tried again after
// the retry policy's wait, its lock renewed meanwhile.
func (s *shareMember) shareFailed(stop context.Context, r *shareRun, k int, f *failure) bool {
	rec := &r.recs[k]
	off := rec.Offset
	r.tries[off]++
	f.attempts = r.tries[off]
	s.reportShareFailure(stop, &r.items[k].msg, rec, f)
	switch {
	case f.class == classPermanent:
		r.setAside[off] = s.onDelivery(f, rec)
		return true
	case f.attempts >= s.cfg.Retry.MaxAttempts || s.lastDelivery(rec):
		// Released now, or left to a lock that runs out, a record on its
		// last delivery would be archived by the broker without a word.
		r.setAside[off] = s.onDelivery(exhausted(f), rec)
		return true
	}
	return retry.Sleep(stop, s.retry.Wait(f.attempts)) == nil
}

// onDelivery adds to f, the failure a record is set aside with, which of
// the group's deliveries it was on.
func (s *shareMember) onDelivery(f *failure, rec *kafkaclient.ShareRecord) *failure {
	g := *f
	g.err = fmt.Errorf("%w (share group delivery %d of %d)", f.err, rec.DeliveryCount, s.settings.DeliveryLimit)
	return &g
}

// batch runs one transaction over r's records per p, and settles those it
// committed, inside the batch hooks as a consumer group's worker runs its
// transactions (see worker.runTx): the batch's scope covers the
// transaction and the hooks of the records it settled, HookBatchStart and
// HookBatchEnd bound it. A share member reads no log end:
// BatchInfo.HighWaterMark is -1.
func (s *shareMember) batch(work context.Context, r *shareRun, p *plan, attempt int) txOutcome {
	items := r.items[:p.n]
	info := kafkaoncetype.BatchInfo{Topic: items[0].msg.Topic, Partition: items[0].msg.Partition, FirstOffset: items[0].msg.Offset,
		LastOffset: items[len(items)-1].msg.Offset, Size: len(items), Attempt: attempt, HighWaterMark: -1, BatchLimit: s.cfg.MaxBatch}
	work, endScope := s.hooks.enterBatch(work, info, items)
	defer endScope()
	for _, h := range s.hooks.Start {
		h(work, info)
	}
	began := time.Now()
	out := s.runShareTx(work, r.items, p)
	if len(s.hooks.End) > 0 {
		res := out.batchResult(time.Since(began))
		for _, h := range s.hooks.End {
			h(work, info, res)
		}
	}
	s.settleCommitted(work, r, out)
	return out
}

// runShareTx runs one positionless transaction over items per p, on a
// goroutine the handler watchdog can abandon (as runTx does for a
// partition's worker).
func (s *shareMember) runShareTx(work context.Context, items []item, p *plan) txOutcome {
	items = items[:p.n]
	first := &items[0].msg
	a := &txAttempt{txDeps: s.txDeps(), topic: first.Topic, partition: first.Partition, items: items, p: p.clone(),
		origin: -1, st: &batchState{}, shareKey: s.key}
	out, abandoned := usercall.Run(work, s.user.limits, func(hctx, ctx context.Context, uc *usercall.Attempt) txOutcome {
		a.uc = uc
		uc.SetCommitCheck(s.offsets.CommitCheck(s.cfg.Name, a.openTopic(), a.partition))
		out := a.tx(hctx, ctx)
		out.st = a.st
		return out
	})
	if abandoned != nil {
		if end := a.openCall.Load(); end != nil {
			(*end)(usercall.ErrAbandoned)
		}
		out = a.abandonedOutcome(abandoned)
	}
	return out
}

// settleCommitted reports and settles the records out committed: each
// accepted when it was applied or found claimed, rejected when it was set
// aside (its letter committed with it).
func (s *shareMember) settleCommitted(ctx context.Context, r *shareRun, out txOutcome) {
	if out.committed == 0 {
		return
	}
	st := out.st
	var accept, reject []kafkaclient.RecordID
	deadLettered := false
	for _, i := range st.failedInTx {
		r.tries[r.recs[i].Offset]++
		s.reportShareFailure(ctx, &r.items[i].msg, &r.recs[i], st.fails[i])
	}
	for i := range r.items[:out.committed] {
		msg, rec := &r.items[i].msg, &r.recs[i]
		if r.provisional[rec.Offset] {
			// The transaction removed its provisional letter (see
			// txAttempt.close).
			delete(r.provisional, rec.Offset)
			s.shareEvent(ctx, kafkaoncetype.ShareProvisionalRemoved, rec.RecordID, nil)
		}
		switch st.fates[i] {
		case fateApplied:
			accept = append(accept, rec.RecordID)
			for _, h := range s.hooks.Applied {
				h(ctx, msg)
			}
		case fateDeadLettered:
			reject = append(reject, rec.RecordID)
			deadLettered = true
			f := st.fails[i]
			s.log.Error("record set aside in dead_letters; rejecting it", s.shareAttrs(rec, slog.String("message_id", msg.ID),
				slog.String("class", string(f.kind)), slog.Int("attempt", f.attempts), slog.String("error", f.err.Error()))...)
			for _, h := range s.hooks.Dead {
				h(ctx, msg, kafkaoncetype.DeadLettered{Class: f.kind, Err: f.err, Attempts: f.attempts})
			}
		default:
			// Delivered again after an accept that was lost, or held by
			// two members at once (a lock ran out under the first): its
			// claim was found, and it is accepted without its handler.
			accept = append(accept, rec.RecordID)
			s.log.Info("record found claimed; accepting it without running the handler", s.shareAttrs(rec, slog.String("message_id", msg.ID))...)
			for _, h := range s.hooks.Skipped {
				h(ctx, msg, kafkaoncetype.SkipAlreadyClaimed)
			}
		}
	}
	for _, cf := range st.conflicts {
		for _, h := range s.hooks.Conflict {
			h(ctx, cf)
		}
	}
	s.locks.settle(ctx, kafkaclient.Accept, accept...)
	s.locks.settle(ctx, kafkaclient.Reject, reject...)
	if deadLettered {
		s.wakePublisher()
	}
}

// reportShareFailure logs a failed attempt of a record and calls the
// failure hooks.
func (s *shareMember) reportShareFailure(ctx context.Context, msg *kafkaoncetype.Message, rec *kafkaclient.ShareRecord, f *failure) {
	s.log.Warn("message failed", s.shareAttrs(rec, slog.String("message_id", msg.ID), slog.Int("attempt", f.attempts),
		slog.String("class", f.class.String()), slog.String("error", f.err.Error()))...)
	later := f.kind == deadletter.ClassRetryLater
	for _, h := range s.hooks.Failed {
		h(ctx, msg, kafkaoncetype.Failure{Err: f.err, Class: f.kind, Attempt: max(f.attempts, 1), Permanent: f.class == classPermanent && !later})
	}
}

func (s *shareMember) shareAttrs(rec *kafkaclient.ShareRecord, extra ...any) []any {
	return append([]any{slog.String("topic", rec.Topic), slog.Int("partition", rec.Partition), slog.Int64("offset", rec.Offset),
		slog.Int("delivery", rec.DeliveryCount)}, extra...)
}
