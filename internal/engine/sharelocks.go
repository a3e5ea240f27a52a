package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// shareLocks keeps a share member's records of the last poll: which are
// still unsettled, and their acquisition locks renewed while they are. The
// loop settles records as their transactions commit; a goroutine renews
// the rest every half lock duration (Renew, then Flush), so a slow
// handler, a retry's wait or a later partition's turn does not let a lock
// run out and the record go to another member. The ShareMember is used by
// one goroutine at a time: mu serialises the loop's settlements and the
// renewals.
type shareLocks struct {
	s  *shareMember
	mu sync.Mutex
	// unsettled are the records of the last poll not settled yet, each
	// with when its lock runs out as far as the member knows: the
	// broker's word at the poll, then a lock duration from each renewal
	// the broker took.
	unsettled map[kafkaclient.RecordID]time.Time
	// lost are the unsettled records whose renewal the broker refused:
	// no longer this member's (see lostLocks).
	lost map[kafkaclient.RecordID]struct{}
	// last are the unsettled records on their last delivery.
	last map[kafkaclient.RecordID]struct{}
	// stopRenewing ends the renewals of the current poll's records.
	stopRenewing func()
}

func newShareLocks(s *shareMember) *shareLocks {
	return &shareLocks{s: s, unsettled: map[kafkaclient.RecordID]time.Time{}, lost: map[kafkaclient.RecordID]struct{}{},
		last: map[kafkaclient.RecordID]struct{}{}}
}

// hold takes the records of a poll, and renews their locks until each is
// settled, or until work ends: a member whose shutdown's grace is over
// keeps no lock, and its renewals, which hold mu, must not hold the
// shutdown either.
func (l *shareLocks) hold(work context.Context, recs []kafkaclient.ShareRecord) {
	l.mu.Lock()
	for i := range recs {
		l.unsettled[recs[i].RecordID] = recs[i].LockedUntil
		if l.s.lastDelivery(&recs[i]) {
			l.last[recs[i].RecordID] = struct{}{}
		}
	}
	l.publish()
	l.mu.Unlock()
	ctx, cancel := context.WithCancel(work)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(l.s.renewEvery())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				l.renew(ctx)
			}
		}
	}()
	// Cancelling ctx also cuts short a renewal's flush in progress, so
	// stopping waits for no broker.
	l.stopRenewing = func() { cancel(); wg.Wait() }
}

// renew renews the locks of the records still unsettled; its flush ends
// with ctx.
func (l *shareLocks) renew(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.unsettled) == 0 {
		return
	}
	ids := make([]kafkaclient.RecordID, 0, len(l.unsettled))
	for id := range l.unsettled {
		if _, lost := l.lost[id]; !lost {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	sent := time.Now()
	if err := l.s.m.Settle(kafkaclient.Renew, ids...); err != nil {
		l.s.log.Warn("could not renew the locks of held records", slog.String("error", err.Error()))
		return
	}
	l.s.log.Debug("renewed the locks of held records", slog.Int("records", len(ids)))
	answered, notTaken := l.flushLocked(ctx)
	if !answered {
		return // none known taken: each lock runs out when it said
	}
	for _, id := range ids {
		if _, lost := l.lost[id]; !lost && !notTaken[id] {
			l.unsettled[id] = sent.Add(l.s.settings.LockDuration)
		}
	}
}

// lostLocks returns those of ids (unsettled records) this member no
// longer holds: the broker refused a renewal, or the lock ran out with no
// renewal taken (the connection or the session is gone). The member stops
// working on them (see shareMember.dropLost).
func (l *shareLocks) lostLocks(ids []kafkaclient.RecordID) map[kafkaclient.RecordID]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	var out map[kafkaclient.RecordID]bool
	for _, id := range ids {
		until, held := l.unsettled[id]
		_, refused := l.lost[id]
		if held && (refused || !until.IsZero() && now.After(until)) {
			if out == nil {
				out = map[kafkaclient.RecordID]bool{}
			}
			out[id] = true
		}
	}
	return out
}

// settle settles ids how, and flushes: once settled, a record's lock is
// no longer renewed.
func (l *shareLocks) settle(ctx context.Context, how kafkaclient.Settlement, ids ...kafkaclient.RecordID) {
	if len(ids) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		delete(l.unsettled, id)
		delete(l.lost, id)
		delete(l.last, id)
	}
	l.publish()
	if err := l.s.m.Settle(how, ids...); err != nil {
		// Not of the last poll, or settled already: a bug of ours, and
		// the record is delivered again when its lock runs out.
		l.s.log.Error("could not settle records", slog.String("settlement", how.String()), slog.String("error", err.Error()))
		return
	}
	_, _ = l.flushLocked(ctx)
}

// publish shows Health what the member holds. It runs under mu.
func (l *shareLocks) publish() {
	l.s.health.shareHeld.Store(int64(len(l.unsettled)))
	l.s.health.shareLast.Store(int64(len(l.last)))
}

// flush flushes the settlements made and not yet answered (a flush that
// outlasted its bound leaves them so, and the member's next poll waits for
// their answers).
func (l *shareLocks) flush(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.flushLocked(ctx)
}

// releaseRest releases the records of the poll still unsettled (a
// shutdown cut its work short), for another member to take at once, and
// stops the renewals.
func (l *shareLocks) releaseRest(ctx context.Context) {
	if l.stopRenewing != nil {
		l.stopRenewing()
		l.stopRenewing = nil
	}
	l.mu.Lock()
	var ids []kafkaclient.RecordID
	for id := range l.unsettled {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	if len(ids) > 0 {
		l.s.log.Info("releasing held records not processed, for delivery again", slog.Int("records", len(ids)))
	}
	l.settle(ctx, kafkaclient.Release, ids...)
}

// flushLocked flushes the settlements made, and says what became of those
// the broker did not take; it reports whether the client answered at all.
// None of them breaks the promise: an accept not taken is delivered again
// and found claimed; a renewal refused means another member may take the
// record, and the claim decides which applies it, but this member no
// longer holds it and stops working on it (lost, see lostLocks).
//
// The flush waits at most a request's bound, and no longer than ctx: the
// loop's flushes are made on work, so a broker that stops answering holds
// a shutdown no longer than its grace (ShutdownTimeout). A flush cut
// short leaves its settlements made and not flushed, which breaks no
// promise either: an accept not answered is delivered again and found
// claimed, and the member, which polls only once they are flushed, is
// stopping.
func (l *shareLocks) flushLocked(ctx context.Context) (answered bool, notTaken map[kafkaclient.RecordID]bool) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	err := l.s.m.Flush(ctx)
	var se *kafkaclient.SettleError
	switch {
	case err == nil:
		return true, nil
	case !errors.As(err, &se):
		l.s.log.Warn("could not flush settlements; records not taken are delivered again and found claimed", slog.String("error", err.Error()))
		return false, nil
	}
	notTaken = map[kafkaclient.RecordID]bool{}
	for _, f := range se.Failed {
		notTaken[f.Record] = true
		attrs := []any{slog.String("topic", f.Record.Topic), slog.Int("partition", f.Record.Partition),
			slog.Int64("offset", f.Record.Offset), slog.String("settlement", f.Settlement.String()), slog.String("error", f.Err.Error())}
		switch f.Settlement {
		case kafkaclient.Accept:
			l.s.log.Info("settlement not taken by the broker; the record will be delivered again and found claimed", attrs...)
			l.s.shareEvent(ctx, kafkaoncetype.ShareSettlementLost, f.Record, f.Err)
		case kafkaclient.Release:
			// Given back either way: taken at once, or when the lock
			// runs out.
			l.s.log.Info("settlement not taken by the broker; the record will be delivered again and found claimed", attrs...)
		case kafkaclient.Renew:
			if errors.Is(f.Err, kafkaclient.ErrNoAnswer) {
				// It may have been taken: the lock runs out when it said,
				// unless a later renewal is taken.
				l.s.log.Warn("lock renewal unanswered; renewing again before the lock runs out", attrs...)
				continue
			}
			l.lost[f.Record] = struct{}{}
			l.s.log.Error("lock renewal refused by the broker: the record is no longer this member's, which stops working on it; another member may take it, and its claim decides who applies it", attrs...)
			l.s.shareEvent(ctx, kafkaoncetype.ShareRenewalRefused, f.Record, f.Err)
		default:
			l.s.log.Warn("settlement not taken by the broker; the record will be delivered again and found set aside", attrs...)
			l.s.shareEvent(ctx, kafkaoncetype.ShareSettlementLost, f.Record, f.Err)
		}
	}
	return true, notTaken
}
