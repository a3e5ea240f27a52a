package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// claimFirst runs the attempt's transaction the ordinary way, in two round
// trips and the handlers' own statements. It reads top to bottom as a batch
// goes:
//
//  1. claim: BEGIN, the session settings, the stored position (locked until
//     COMMIT), the opening of the batch and the claims, in one round trip
//     (a share group member's transaction has no stored position: it
//     neither locks nor advances one, see txAttempt.shareKey);
//  2. sort: the position checked, the messages whose claim found a row
//     sorted into duplicates (skipped) and conflicts (set aside);
//  3. handle: the handler for each newly claimed message (or the
//     BatchHandler once), inside savepoints when the plan says so;
//  4. close: the batch's closing statements (the handler's queued ones, dead
//     letters, suspects, the new position);
//  5. commit: sent with the closing statements, in one round trip, and what
//     a failure means.
//
// The worker then marks the committed messages (afterCommit): hooks, and
// the offset handed to the Kafka committer. The handler gets hctx;
// everything else runs on ctx, so a handler cut off by the watchdog does
// not take the transaction's own statements with it.
func (a *txAttempt) claimFirst(hctx, ctx context.Context) (out txOutcome) {
	bt, gated, out := a.claim(ctx)
	if bt == nil {
		return out
	}
	defer bt.rollback(ctx)
	a.uc.Hold(bt.cutLoose)
	if out := a.sort(ctx, bt.tx); out.kind != succeeded {
		return out
	}
	h, out := a.handle(hctx, ctx, bt.tx)
	if out.kind != succeeded {
		return out
	}
	b, err := a.close(&h)
	if err != nil {
		return infra(err)
	}
	out = a.commit(ctx, bt, b, &h)
	if a.serialized && out.committed > 0 {
		out.held = time.Since(gated)
	}
	return out
}

// claim builds the attempt's claims and begins its transaction with them
// (see claimFirst). bt is nil when it did not begin; out then says why.
func (a *txAttempt) claim(ctx context.Context) (bt *batchTx, gated time.Time, out txOutcome) {
	items, p, st := a.items, &a.p, a.st
	for i := range items {
		f := p.deadLetter[i]
		if items[i].idErr != nil {
			st.fates[i], st.fails[i] = fateDeadLettered, f
			continue
		}
		c := claims.Claim{MessageID: items[i].msg.ID, Fingerprint: items[i].fp, Offset: items[i].msg.Offset}
		switch {
		case f != nil:
			c.Status, c.Attempts = dedupe.StatusDeadLettered, f.attempts
		case items[i].suspect != nil && a.cfg.SuspectDuplicates == kafkaoncetype.SkipSuspects:
			c.Status = dedupe.StatusSuspectDuplicate
		}
		st.claims = append(st.claims, c)
		st.claimItem = append(st.claimItem, i)
	}
	st.claimedBy = st.claimedBy[:len(st.claims)]

	// The stored position is locked until COMMIT, so nothing moves it under
	// this transaction; the opening of the batch means only the consumer
	// can commit it now (see positions.QueueOpen).
	b := &pgx.Batch{}
	a.stored = nil
	if !a.positionless() {
		a.offsets.QueueLock(b, a.cfg.Name, a.topic, a.partition, &a.stored)
	}
	a.offsets.QueueOpen(b, a.cfg.Name, a.openTopic(), a.partition)
	if len(st.claims) > 0 {
		a.claims.QueueClaim(b, a.cfg.Name, a.topic, a.partition, st.claims, st.claimedBy)
	}
	bt, gated, err := a.begin(ctx, b)
	var busy *gateBusyError
	switch {
	case errors.As(err, &busy):
		return nil, gated, txOutcome{kind: gateBusy, err: busy, fail: newFailure(classInfra, "", busy)}
	case err != nil:
		return nil, gated, infra(fmt.Errorf("begin and claim: %w", err))
	}
	a.conn = bt.tx.Conn().PgConn()
	return bt, gated, txOutcome{}
}

// sort checks the stored position the claim read, and sorts the messages
// by what their claims found: new, duplicates (skipped), conflicts (set
// aside, or the transaction fails under StopPartition), and those the plan
// sets aside.
func (a *txAttempt) sort(ctx context.Context, tx pgx.Tx) txOutcome {
	if lost := a.positionLost(a.stored); lost != nil {
		return txOutcome{kind: positionLost, err: lost, fail: newFailure(classInfra, "", lost)}
	}
	items, p, st := a.items, &a.p, a.st
	st.sawDuplicates = false
	for j, i := range st.claimItem {
		st.claimed[i] = st.claimedBy[j]
		// Duplicates foreseen from memory do not count: a one-trip batch
		// skips those without a claim (see oneTrip).
		st.sawDuplicates = st.sawDuplicates || !st.claimedBy[j] && !foreseen(items, i, a.next)
		switch {
		case !st.claimed[i]:
		case p.deadLetter[i] != nil:
			st.fates[i], st.fails[i] = fateDeadLettered, p.deadLetter[i]
		case st.claims[j].Status == dedupe.StatusSuspectDuplicate:
			st.fates[i] = fateSkippedSuspect
		}
	}
	return a.resolveUnclaimed(ctx, tx)
}

// resolveUnclaimed sorts the messages whose claim found an existing row into
// duplicates (same fingerprint: skipped) and conflicts (different
// fingerprint: set aside, or the transaction fails under StopPartition).
func (a *txAttempt) resolveUnclaimed(ctx context.Context, tx pgx.Tx) txOutcome {
	items, st := a.items, a.st
	var ids []string
	for _, i := range st.claimItem {
		if !st.claimed[i] {
			ids = append(ids, items[i].msg.ID)
		}
	}
	if len(ids) == 0 {
		return txOutcome{}
	}
	// A new statement sees rows committed by other transactions since the
	// claim (READ COMMITTED), and rows this transaction just inserted for an
	// earlier copy in the same batch.
	existing, err := a.claims.Lookup(ctx, tx, a.cfg.Name, ids)
	if err != nil {
		return infra(err)
	}
	for _, i := range st.claimItem {
		if st.claimed[i] {
			continue
		}
		rec, ok := existing[items[i].msg.ID]
		if !ok {
			// Deleted between the claim and the lookup (pruning): run again.
			return infra(fmt.Errorf("claim of message id %q vanished during the batch", items[i].msg.ID))
		}
		inBatch := rec.Topic == a.topic && rec.Partition == a.partition && claimedHere(items, st, rec.Offset)
		if rec.Fingerprint == items[i].fp {
			st.fates[i], st.fails[i] = fateSkipped, nil
			if inBatch {
				st.fates[i] = fateSkippedInBatch
			}
			continue
		}
		if inBatch {
			rec.Status = "" // the first copy is not stored yet
		}
		cf := &kafkaoncetype.FingerprintConflictError{Topic: a.topic, Partition: a.partition, Offset: items[i].msg.Offset,
			MessageID: items[i].msg.ID, Fingerprint: items[i].fp, Existing: rec}
		f := newFailure(classPermanent, deadletter.ClassConflict, cf)
		if a.cfg.OnPermanentFailure == kafkaoncetype.StopPartition {
			return failedMessage(i, cf, f)
		}
		st.fates[i], st.fails[i] = fateDeadLettered, f
		st.conflicts = append(st.conflicts, cf)
	}
	return txOutcome{}
}

// claimedHere reports whether this transaction claimed the message at off.
func claimedHere(items []item, st *batchState, off int64) bool {
	for i := range items {
		if items[i].msg.Offset == off {
			return st.claimed[i]
		}
	}
	return false
}

// positionLostError means the stored position is behind what this worker
// committed, so the database lost committed transactions (a crash with
// asynchronous commit, a failover to a lagging replica, a restore). Their
// effects, claims and positions are gone together; the worker must fetch
// again from the stored position.
type positionLostError struct {
	stored, believed int64
	// missing means the partition has no stored position at all any more; the
	// worker goes on from the partition's first start, or from the log's
	// start when it does not know the first start (see restartAfterLoss).
	missing bool
}

func (e *positionLostError) Error() string {
	if e.missing {
		from := "the log's start"
		if e.stored != fromLogStart {
			from = fmt.Sprint(e.stored)
		}
		return fmt.Sprintf("the stored position is gone but this worker had committed up to %d: the database lost committed transactions; processing again from %s", e.believed, from)
	}
	return fmt.Sprintf("the stored position is %d but this worker had committed up to %d: the database lost committed transactions; processing again from %d", e.stored, e.believed, e.stored)
}

// positionLost compares the stored position found by the transaction with
// the one the worker committed last.
func (a *txAttempt) positionLost(prev *int64) *positionLostError {
	switch {
	case !a.positionKnown:
		return nil
	case prev == nil:
		return &positionLostError{stored: restartAfterLoss(a.origin), believed: a.next, missing: true}
	case *prev < a.next:
		return &positionLostError{stored: *prev, believed: a.next}
	}
	return nil
}

// handled is what the handlers did in a transaction: the BatchHandler's
// Batch (nil without one), where the transaction ends (end: it commits
// items[:end]; cut, when a message cut it short, with its failure), and
// the messages set aside inside it.
type handled struct {
	batch      *Batch
	end, cut   int
	fail       *failure
	dlIDs      []string
	dlAttempts []int32
}

// handle runs the handlers for the newly claimed messages: the BatchHandler
// once for those before the plan's savepointFrom, then one call per message
// for the rest (all of them for a Handler), each in a savepoint from
// savepointFrom on, so that a failing message can be set aside without
// losing its neighbours.
func (a *txAttempt) handle(hctx, ctx context.Context, tx pgx.Tx) (h handled, out txOutcome) {
	items, p, st := a.items, &a.p, a.st
	h.end, h.cut = len(items), -1
	batched := a.cfg.HandleBatch != nil
	if batched {
		if h.batch, out = a.handleBatch(hctx, ctx, tx); out.kind != succeeded {
			return h, out
		}
	}
	// In savepoint mode one savepoint stays open: releasing the previous
	// message's and setting the next one's share a round trip, and COMMIT
	// releases the last.
	savepointOpen := false
	for i := range items {
		if st.fates[i] != fateApplied || batched && i < p.savepointFrom {
			continue
		}
		inSavepoint := i >= p.savepointFrom
		if inSavepoint {
			sql := "SAVEPOINT kafkaonce_message"
			if savepointOpen {
				sql = "RELEASE SAVEPOINT kafkaonce_message; SAVEPOINT kafkaonce_message"
			}
			if _, err := tx.Exec(ctx, sql); err != nil {
				return h, infra(err)
			}
			savepointOpen = true
		}
		began := time.Now()
		cctx, endCall := a.hooks.enterHandler(hctx, &items[i].msg)
		a.openCall.Store(&endCall) // ended by runTx if the call is abandoned
		a.progress.step()
		err := a.user.call(cctx, a.uc, i, tx, &items[i].msg)
		a.openCall.Store(nil)
		endCall(err)
		if errors.Is(err, usercall.ErrAbandoned) {
			return h, infra(err) // nobody reads it: the worker has moved on
		}
		for _, hook := range a.hooks.Handler {
			hook(ctx, &items[i].msg, time.Since(began), err)
		}
		if err == nil {
			continue
		}
		merr, f := a.messageFailure(&items[i].msg, err)
		a.raceMayHaveFailed(tx, f)
		switch {
		case f.class == classInfra:
			// A deadlock or a lost connection inside the handler is not the
			// message's fault: the whole transaction runs again.
			return h, infra(merr)
		case !inSavepoint || a.uc.TimedOut():
			return h, failedMessage(i, merr, f)
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT kafkaonce_message"); err != nil {
			// The connection did not survive the handler's failure (pgx
			// closes it when it cannot encode part of a pipeline): the
			// transaction is gone, and the message's failure stands.
			return h, failedMessage(i, merr, f)
		}
		if f.class == classPermanent && a.cfg.OnPermanentFailure == kafkaoncetype.DeadLetter {
			st.fates[i], st.fails[i] = fateDeadLettered, f
			st.failedInTx = append(st.failedInTx, i)
			h.dlIDs = append(h.dlIDs, items[i].msg.ID)
			h.dlAttempts = append(h.dlAttempts, int32(f.attempts))
			continue
		}
		// Cut the batch short here: commit what comes before.
		h.end, h.cut, h.fail = i, i, f
		break
	}
	if h.end == 0 {
		return h, failedMessage(h.cut, h.fail.err, h.fail)
	}
	return h, txOutcome{}
}

// handleBatch calls the BatchHandler once with every newly claimed message
// before the plan's savepointFrom (those after it are handled one per call,
// in savepoints, by handle). It returns the Batch, whose queued
// statements the caller sends with its closing statements.
func (a *txAttempt) handleBatch(hctx, ctx context.Context, tx pgx.Tx) (*Batch, txOutcome) {
	var msgs []*kafkaoncetype.Message
	var index []int
	for i := range a.items[:a.p.savepointFrom] {
		if a.st.fates[i] == fateApplied {
			msgs = append(msgs, &a.items[i].msg)
			index = append(index, i)
		}
	}
	if len(msgs) == 0 {
		return nil, txOutcome{}
	}
	b := a.user.newBatch(msgs, index)
	began := time.Now()
	a.progress.step()
	err := a.user.callBatch(hctx, a.uc, tx, b)
	if errors.Is(err, usercall.ErrAbandoned) {
		return nil, infra(err) // nobody reads it: the worker has moved on
	}
	a.reportBatchCall(ctx, b, time.Since(began), err)
	if err != nil {
		out := a.batchFailed(b, err)
		if out.fail != nil {
			a.raceMayHaveFailed(tx, out.fail)
		}
		return nil, out
	}
	return b, txOutcome{}
}

// reportBatchCall tells the handler hooks about a BatchHandler call that
// took d: each message of the call with an equal share of it.
func (a *txAttempt) reportBatchCall(ctx context.Context, b *Batch, d time.Duration, err error) {
	if len(a.hooks.Handler) == 0 || len(b.Messages) == 0 {
		return
	}
	share := d / time.Duration(len(b.Messages))
	for _, m := range b.Messages {
		for _, h := range a.hooks.Handler {
			h(ctx, m, share, err)
		}
	}
}

// close builds the batch's closing statements. The BatchHandler's queued
// statements go first, so that a failure among them is told from one of
// ours by its place; then the batch's closing, which fails if a statement
// of the handlers' ended the transaction, before any of ours runs; then
// the claims' new status, the dead letters, the suspects, the attempts
// cleared, the new position and the partition's pace.
func (a *txAttempt) close(h *handled) (*pgx.Batch, error) {
	items, p, st := a.items, &a.p, a.st
	b := &pgx.Batch{}
	if h.batch != nil {
		b.QueuedQueries = append(b.QueuedQueries, h.batch.statements()...)
	}
	a.offsets.QueueClose(b, a.cfg.Name, a.openTopic(), a.partition)
	if len(h.dlIDs) > 0 {
		a.claims.QueueSetStatus(b, a.cfg.Name, h.dlIDs, h.dlAttempts, dedupe.StatusDeadLettered)
	}
	if h.cut >= 0 {
		var tail []string
		for i := h.cut; i < len(items); i++ {
			if st.claimed[i] {
				tail = append(tail, items[i].msg.ID)
			}
		}
		if len(tail) > 0 {
			a.claims.QueueUnclaim(b, a.cfg.Name, tail)
		}
	}
	if len(p.provisional) > 0 {
		// Before the letters: a record set aside gets its final letter
		// in place of its provisional one.
		var offs []int64
		for i := range items[:h.end] {
			if p.provisional[items[i].msg.Offset] {
				offs = append(offs, items[i].msg.Offset)
			}
		}
		if len(offs) > 0 {
			a.letters.QueueRemoveProvisional(b, a.cfg.Name, a.topic, a.partition, offs)
		}
	}
	var letters []deadletter.Letter
	for i := range items[:h.end] {
		if st.fates[i] == fateDeadLettered {
			letters = append(letters, letterFor(&items[i], st.fails[i]))
		}
	}
	if len(letters) > 0 {
		if err := a.letters.QueueInsert(b, a.cfg.Name, a.topic, a.partition, letters); err != nil {
			return nil, err
		}
	}
	a.queueSuspects(b, h.end)
	if p.clearAttempts {
		a.attempts.QueueClear(b, a.cfg.Name, a.topic, a.partition, items[0].msg.Offset, items[h.end-1].msg.Offset)
	}
	if !a.positionless() {
		a.offsets.QueueAdvance(b, a.cfg.Name, a.topic, a.partition, items[h.end-1].end)
	}
	a.queuePace(b)
	return b, nil
}

// letterFor builds the dead letter of a message.
func letterFor(it *item, f *failure) deadletter.Letter {
	l := deadletter.Letter{
		Topic: it.msg.Topic, Partition: it.msg.Partition, Offset: it.msg.Offset, MessageID: it.msg.ID,
		Key: it.msg.Key, Value: it.msg.Value, MessageTime: it.msg.Time,
		Class: f.kind, Error: f.err.Error(), Attempts: f.attempts, FirstFailedAt: f.first, LastFailedAt: f.last,
	}
	for _, h := range it.msg.Headers {
		l.Headers = append(l.Headers, deadletter.Header{Key: h.Key, Value: h.Value})
	}
	if f.kind == deadletter.ClassRetryLater {
		at := f.last.Add(f.retryAfter)
		l.RetryAt = &at
	}
	return l
}

// queueSuspects adds the suspect duplicates among items[:end] that the
// transaction applies or skips to b.
func (a *txAttempt) queueSuspects(b *pgx.Batch, end int) {
	var suspects []dedupe.Suspect
	for i := range a.items[:end] {
		it := &a.items[i]
		if s := it.suspect; s != nil && (a.st.fates[i] == fateApplied || a.st.fates[i] == fateSkippedSuspect) {
			suspects = append(suspects, dedupe.Suspect{Offset: it.msg.Offset, MessageID: it.msg.ID, Fingerprint: it.fp,
				FirstMessageID: s.MessageID, FirstOffset: s.Offset, Skipped: a.st.fates[i] == fateSkippedSuspect})
		}
	}
	if len(suspects) > 0 {
		a.claims.QueueSuspects(b, a.cfg.Name, a.topic, a.partition, suspects)
	}
}

// queuePace adds to b the write of the partition's pace to its run's
// record, when there is something new to show.
func (a *txAttempt) queuePace(b *pgx.Batch) {
	if a.paceRow != nil {
		a.attempts.QueuePace(b, a.cfg.Name, a.topic, a.partition, *a.paceRow)
	}
}

// commit sends b, the closing statements, with COMMIT, in one round trip,
// and says what a failure means: by the statement that failed, whose it
// was (the BatchHandler's queued ones, ours, COMMIT itself).
func (a *txAttempt) commit(ctx context.Context, bt *batchTx, b *pgx.Batch, h *handled) txOutcome {
	userStatements := 0
	if h.batch != nil {
		userStatements = len(h.batch.statements())
	}
	closing := len(b.QueuedQueries)
	if err := bt.commitWith(ctx, b); err != nil {
		var ce *commitError
		errors.As(err, &ce)
		return a.commitFailed(ce, h, userStatements, closing)
	}
	if h.cut >= 0 {
		out := failedMessage(h.cut, h.fail.err, h.fail)
		out.committed = h.end
		return out
	}
	return txOutcome{committed: h.end}
}

// commitFailed says what a transaction whose closing round trip failed
// with ce comes to, by the statement that failed: the first userStatements
// are the BatchHandler's queued ones, then come the consumer's own, and
// the COMMIT is at index closing.
func (a *txAttempt) commitFailed(ce *commitError, h *handled, userStatements, closing int) txOutcome {
	var pgErr *pgconn.PgError
	switch {
	case ce.unknown():
		return a.commitUnknown(ce.err)
	case ce.stmt == notSent:
		return infra(fmt.Errorf("commit: nothing was sent: %w", ce.err))
	case errors.As(ce.err, &pgErr) && pgErr.Code == positions.TxEnded:
		return a.txEnded(h, ce.err)
	case pgErr != nil && pgErr.Code == schema.SessionChanged:
		return a.sessionChanged(h, ce.err)
	case pgErr != nil && pgErr.Code == readOnlyTransaction && ce.stmt >= userStatements:
		// The batch wrote when it began, so the server was not read only
		// then, and a transaction does not turn read only by itself: a
		// handler made it so (set_config), as it would on every retry.
		return a.handlersFailed(h, fmt.Errorf("the consumer's closing statements found the transaction made read only by a handler: %w", ce.err))
	case ce.stmt < userStatements:
		return a.batchFailed(h.batch, ce.err)
	case ce.stmt == closing:
		return a.commitRefused(h, ce.err)
	}
	return a.ownStatementFailed(ce.err)
}
