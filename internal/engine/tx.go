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
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
)

// tx runs the attempt's transaction: claim the ids, sort out duplicates and
// conflicts, run the handler for each newly claimed message, set aside what
// the plan says and what fails permanently inside a savepoint, write dead
// letters, advance the stored position, commit. The handler gets hctx;
// everything else runs on ctx, so a handler cut off by the watchdog does
// not take the transaction's own statements with it.
func (a *txAttempt) tx(hctx, ctx context.Context) (out txOutcome) {
	if a.oneTripEligible() {
		if out, ok := a.oneTrip(hctx, ctx); ok {
			return out
		}
	}
	items, p, st := a.items, &a.p, a.st
	out.failedAt = -1
	n := len(items)
	st.reset(n)
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
		case items[i].suspect != nil && a.c.cfg.SuspectDuplicates == SkipSuspects:
			c.Status = dedupe.StatusSuspectDuplicate
		}
		st.claims = append(st.claims, c)
		st.claimItem = append(st.claimItem, i)
	}
	st.claimedBy = resize(st.claimedBy, len(st.claims))

	// One round trip: BEGIN, the session settings, the stored position
	// (locked until COMMIT, so nothing moves it under this transaction),
	// the opening of the batch (only the consumer can commit it now: see
	// positions.QueueOpen) and the claims.
	b := &pgx.Batch{}
	var prev *int64
	a.c.offsets.QueueLock(b, a.c.cfg.Name, a.topic, a.partition, &prev)
	a.c.offsets.QueueOpen(b, a.c.cfg.Name, a.topic, a.partition)
	if len(st.claims) > 0 {
		a.c.claims.QueueClaim(b, a.c.cfg.Name, a.topic, a.partition, st.claims, st.claimedBy)
	}
	bt, gated, err := a.begin(ctx, b)
	var busy *gateBusyError
	if errors.As(err, &busy) {
		return txOutcome{failedAt: -1, err: busy, fail: newFailure(classInfra, "", busy), gateBusy: true}
	}
	if err != nil {
		return infra(fmt.Errorf("begin and claim: %w", err))
	}
	defer bt.rollback(ctx)
	defer func() {
		if a.serialized && out.committed > 0 {
			out.held = time.Since(gated)
		}
	}()
	tx := bt.tx
	a.uc.Hold(bt.cutLoose)
	if lost := a.positionLost(prev); lost != nil {
		return txOutcome{failedAt: -1, err: lost, fail: newFailure(classInfra, "", lost), lost: lost}
	}
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
	if res := a.resolveUnclaimed(ctx, tx); res.err != nil {
		return res
	}

	batched := a.c.cfg.HandleBatch != nil
	var batch *Batch
	if batched {
		var res txOutcome
		if batch, res = a.handleBatch(hctx, ctx, tx); res.err != nil {
			return res
		}
	}
	cut := -1
	var dlIDs []string
	var dlAttempts []int32
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
				return infra(err)
			}
			savepointOpen = true
		}
		began := time.Now()
		err := a.c.user.call(hctx, a.uc, i, tx, &items[i].msg)
		if errors.Is(err, usercall.ErrAbandoned) {
			return infra(err) // nobody reads it: the worker has moved on
		}
		for _, h := range a.c.hooks.Handler {
			h(ctx, &items[i].msg, time.Since(began), err)
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
			return infra(merr)
		case !inSavepoint || a.uc.TimedOut():
			return txOutcome{failedAt: i, err: merr, fail: f}
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT kafkaonce_message"); err != nil {
			// The connection did not survive the handler's failure (pgx
			// closes it when it cannot encode part of a pipeline): the
			// transaction is gone, and the message's failure stands.
			return txOutcome{failedAt: i, err: merr, fail: f}
		}
		if f.class == classPermanent && a.c.cfg.OnPermanentFailure == DeadLetter {
			st.fates[i], st.fails[i] = fateDeadLettered, f
			st.failedInTx = append(st.failedInTx, i)
			dlIDs = append(dlIDs, items[i].msg.ID)
			dlAttempts = append(dlAttempts, int32(f.attempts))
			continue
		}
		// Cut the batch short here: commit what comes before.
		cut, out.fail = i, f
		break
	}
	end := n
	if cut >= 0 {
		end = cut
	}
	if end == 0 {
		return txOutcome{failedAt: cut, err: out.fail.err, fail: out.fail}
	}

	// The BatchHandler's queued statements go first, so that a failure
	// among them is told from one of ours by its place; then the batch's
	// closing, which fails if a statement of the handlers' ended the
	// transaction, before any of ours runs.
	b = &pgx.Batch{}
	userStatements := 0
	if batch != nil {
		b.QueuedQueries = append(b.QueuedQueries, batch.statements()...)
		userStatements = len(b.QueuedQueries)
	}
	a.c.offsets.QueueClose(b, a.c.cfg.Name, a.topic, a.partition)
	if len(dlIDs) > 0 {
		a.c.claims.QueueSetStatus(b, a.c.cfg.Name, dlIDs, dlAttempts, dedupe.StatusDeadLettered)
	}
	if cut >= 0 {
		var tail []string
		for i := cut; i < n; i++ {
			if st.claimed[i] {
				tail = append(tail, items[i].msg.ID)
			}
		}
		if len(tail) > 0 {
			a.c.claims.QueueUnclaim(b, a.c.cfg.Name, tail)
		}
	}
	var letters []deadletter.Letter
	for i := range items[:end] {
		if st.fates[i] == fateDeadLettered {
			letters = append(letters, letterFor(&items[i], st.fails[i]))
		}
	}
	if len(letters) > 0 {
		if err := a.c.letters.QueueInsert(b, a.c.cfg.Name, a.topic, a.partition, letters); err != nil {
			return infra(err)
		}
	}
	a.queueSuspects(b, end)
	if p.clearAttempts {
		a.c.attempts.QueueClear(b, a.c.cfg.Name, a.topic, a.partition, items[0].msg.Offset, items[end-1].msg.Offset)
	}
	a.c.offsets.QueueAdvance(b, a.c.cfg.Name, a.topic, a.partition, items[end-1].msg.Offset+1)
	a.queuePace(b)
	closing := len(b.QueuedQueries)
	// One round trip: the queued effects, the closing statements, COMMIT.
	if err := bt.commitWith(ctx, b); err != nil {
		var ce *commitError
		errors.As(err, &ce)
		var pgErr *pgconn.PgError
		switch {
		case ce.unknown():
			return a.commitUnknown(ce.err)
		case ce.stmt == notSent:
			return infra(fmt.Errorf("commit: nothing was sent: %w", ce.err))
		case errors.As(ce.err, &pgErr) && pgErr.Code == positions.TxEnded:
			return a.txEnded(batch, end, ce.err)
		case ce.stmt < userStatements:
			return a.batchFailed(batch, ce.err)
		case ce.stmt == closing:
			return a.commitRefused(end, ce.err)
		}
		return a.ownStatementFailed(ce.err)
	}
	out.committed = end
	if cut >= 0 {
		out.failedAt, out.err = cut, out.fail.err
	}
	return out
}

// commitRefused is the outcome of a COMMIT the server refused. A
// serialisation failure is the database's; anything else was caused by
// what the handlers wrote (a deferred constraint checked at COMMIT).
func (a *txAttempt) commitRefused(end int, err error) txOutcome {
	return a.handlersFailed(end, fmt.Errorf("commit refused: %w", err))
}

// txEnded is the outcome of a transaction that a statement of the
// handlers' ended (a COMMIT, refused with the rollback of all of it, or a
// ROLLBACK), found by the batch's closing or its COMMIT (see
// positions.QueueOpen). Nothing of the batch is durable: the handler that
// did it failed, a misuse to set aside. When the statement was queued,
// the Batch's messages are tried one per call; otherwise one per
// transaction (a handler whose COMMIT or ROLLBACK left the connection
// outside any transaction is caught after its call instead).
func (a *txAttempt) txEnded(batch *Batch, end int, err error) txOutcome {
	err = fmt.Errorf("%w (%w)", ErrTxEnded, err)
	if batch != nil {
		return a.batchFailed(batch, err)
	}
	return a.handlersFailed(end, err)
}

// handlersFailed is the outcome of a transaction that what its handlers
// did made fail, at the end, when it can no longer tell which of them:
// with one message that message failed, with several a transaction per
// message tells which. A failure of the database's is retried.
func (a *txAttempt) handlersFailed(end int, err error) txOutcome {
	f := classifyHandlerError(err)
	switch {
	case f.class == classInfra:
		return infra(err)
	case end == 1:
		merr, f := a.messageFailure(&a.items[0].msg, err)
		return txOutcome{failedAt: 0, err: merr, fail: f}
	}
	return txOutcome{failedAt: -1, oneByOne: true, err: fmt.Errorf("the %d messages at offsets %d to %d: %w; applying them one per transaction",
		end, a.items[0].msg.Offset, a.items[end-1].msg.Offset, err)}
}

// ownStatementFailed is the outcome of a failure of one of the
// consumer's own closing statements (the position, dead letters, claims'
// status). The database's failures are retried. Data it refuses (a value
// out of range, a constraint of the table's) it would refuse again on
// every retry, stalling the partition without a word: the partition
// stops instead, saying why.
func (a *txAttempt) ownStatementFailed(err error) txOutcome {
	if !isPermanentSQLError(err) {
		return infra(fmt.Errorf("record position: %w", err))
	}
	return txOutcome{failedAt: -1, stop: true, err: &PartitionError{Topic: a.topic, Partition: a.partition,
		Err: fmt.Errorf("the consumer's own statements closing the batch at offsets %d to %d were refused, and would be again: %w",
			a.items[0].msg.Offset, a.items[len(a.items)-1].msg.Offset, err)}}
}

// handleBatch calls the BatchHandler once with every newly claimed message
// before the plan's savepointFrom (those after it are handled one per call,
// in savepoints, by the loop in tx). It returns the Batch, whose queued
// statements the caller sends with its closing statements.
func (a *txAttempt) handleBatch(hctx, ctx context.Context, tx pgx.Tx) (*Batch, txOutcome) {
	var msgs []*Message
	var index []int
	for i := range a.items[:a.p.savepointFrom] {
		if a.st.fates[i] == fateApplied {
			msgs = append(msgs, &a.items[i].msg)
			index = append(index, i)
		}
	}
	if len(msgs) == 0 {
		return nil, txOutcome{failedAt: -1}
	}
	b := a.c.user.newBatch(msgs, index)
	began := time.Now()
	err := a.c.user.callBatch(hctx, a.uc, tx, b)
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
	return b, txOutcome{failedAt: -1}
}

// reportBatchCall tells the handler hooks about a BatchHandler call that
// took d: each message of the call with an equal share of it.
func (a *txAttempt) reportBatchCall(ctx context.Context, b *Batch, d time.Duration, err error) {
	if len(a.c.hooks.Handler) == 0 || len(b.Messages) == 0 {
		return
	}
	share := d / time.Duration(len(b.Messages))
	for _, m := range b.Messages {
		for _, h := range a.c.hooks.Handler {
			h(ctx, m, share, err)
		}
	}
}

// batchFailed is the outcome of a BatchHandler call (or of its queued
// statements) that failed. With one message the failure is that message's;
// with more, the transaction is run again with one message per call.
func (a *txAttempt) batchFailed(b *Batch, err error) txOutcome {
	if len(b.Messages) == 1 {
		i := b.index[0]
		merr, f := a.messageFailure(&a.items[i].msg, err)
		if f.class == classInfra {
			return infra(merr)
		}
		return txOutcome{failedAt: i, err: merr, fail: f}
	}
	f := classifyHandlerError(err)
	if f.class == classInfra {
		return infra(err)
	}
	first, last := a.items[b.index[0]].msg.Offset, a.items[b.index[len(b.index)-1]].msg.Offset
	return txOutcome{failedAt: -1, isolate: true,
		err: fmt.Errorf("batch handler failed for the %d messages at offsets %d to %d; handling them one at a time: %w", len(b.Messages), first, last, err)}
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
		return txOutcome{failedAt: -1}
	}
	// A new statement sees rows committed by other transactions since the
	// claim (READ COMMITTED), and rows this transaction just inserted for an
	// earlier copy in the same batch.
	existing, err := a.c.claims.Lookup(ctx, tx, a.c.cfg.Name, ids)
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
		cf := &FingerprintConflictError{Topic: a.topic, Partition: a.partition, Offset: items[i].msg.Offset,
			MessageID: items[i].msg.ID, Fingerprint: items[i].fp, Existing: rec}
		f := newFailure(classPermanent, deadletter.ClassConflict, cf)
		if a.c.cfg.OnPermanentFailure == StopPartition {
			return txOutcome{failedAt: i, err: cf, fail: f}
		}
		st.fates[i], st.fails[i] = fateDeadLettered, f
		st.conflicts = append(st.conflicts, cf)
	}
	return txOutcome{failedAt: -1}
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
	return l
}

func invalidIDFailure(err error) *failure {
	return newFailure(classPermanent, deadletter.ClassInvalidID, err)
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
