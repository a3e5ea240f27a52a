package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
)

// handlerCutoffGrace is how long a handler whose context was cancelled for
// exceeding HandlerTimeout may take to return before it is abandoned.
const handlerCutoffGrace = 2 * time.Second

// fate is what a transaction did with one message.
type fate uint8

const (
	fateApplied fate = iota
	fateSkipped
	fateSkippedInBatch
	fateDeadLettered
	fateSkippedSuspect
)

// batchState holds per-transaction scratch space, reused across
// transactions. It belongs to the goroutine running the transaction until
// runTx returns.
type batchState struct {
	claims     []dedupe.Claim
	claimItem  []int // claims[j] is for items[claimItem[j]]
	claimedBy  []bool
	claimed    []bool
	fates      []fate
	fails      []*failure // why fateDeadLettered messages were set aside
	conflicts  []*FingerprintConflictError
	failedInTx []int // messages that failed inside a savepoint and were set aside
}

func (st *batchState) reset(n int) {
	st.claims, st.claimItem = st.claims[:0], st.claimItem[:0]
	st.claimed = resize(st.claimed, n)
	st.fates = resize(st.fates, n)
	st.fails = resize(st.fails, n)
	st.conflicts, st.failedInTx = st.conflicts[:0], st.failedInTx[:0]
}

// txOutcome is the result of one transaction.
type txOutcome struct {
	// committed counts the items committed: all of the plan on success, a
	// prefix when a savepoint transaction was cut short, else 0.
	committed int
	// err is nil when the whole plan committed.
	err error
	// failedAt is the index of the message that failed, or -1 when the
	// transaction failed as a whole (infrastructure).
	failedAt int
	fail     *failure
	// lost is set when the stored position turned out to be behind what
	// this worker committed: the database lost transactions.
	lost *positionLostError
	// isolate is set when a BatchHandler call over several messages failed:
	// the transaction runs again with one message per call.
	isolate bool
}

func infra(err error) txOutcome {
	return txOutcome{failedAt: -1, err: err, fail: newFailure(classInfra, "", err)}
}

// txRun is shared between runTx and the goroutine running the transaction,
// for the handler watchdog.
type txRun struct {
	handlerSince atomic.Int64 // unix nanoseconds the running handler call started; 0 between calls
	current      atomic.Int32 // index of the message being handled
	timedOut     atomic.Bool
	conn         atomic.Value // net.Conn of the transaction
}

// runTx runs one transaction over items per p, between the batch hooks, on
// a goroutine of its own so that a handler that hangs, ignoring its context,
// can be cut off: after HandlerTimeout its context is cancelled, and if it
// has not returned handlerCutoffGrace later, its connection is closed (the
// server rolls the transaction back) and it is abandoned.
func (w *worker) runTx(work context.Context, items []item, p *plan, attempt int) txOutcome {
	items = items[:p.n]
	info := BatchInfo{Topic: w.topic, Partition: w.partition, FirstOffset: items[0].msg.Offset,
		LastOffset: items[len(items)-1].msg.Offset, Size: len(items), Attempt: attempt, HighWaterMark: w.hwm}
	for _, h := range w.c.hooks.start {
		h.OnBatchStart(work, info)
	}
	began := time.Now()
	hctx, cancel := context.WithCancel(work)
	defer cancel()
	run := &txRun{}
	st := &w.batch
	done := make(chan txOutcome, 1)
	go func() { done <- w.tx(hctx, work, items, p, st, run) }()
	out, abandoned := w.await(done, cancel, run, items)
	if abandoned {
		// The abandoned goroutine still owns the scratch space and the batch
		// buffer; give the worker new ones.
		w.batch, w.items, w.batchCall = batchState{}, nil, Batch{}
	}
	if len(w.c.hooks.end) > 0 {
		r := BatchResult{Duration: time.Since(began), Err: out.err}
		if !abandoned {
			for _, f := range st.fates[:out.committed] {
				switch f {
				case fateApplied:
					r.Applied++
				case fateDeadLettered:
				default:
					r.Skipped++
				}
			}
		}
		for _, h := range w.c.hooks.end {
			h.OnBatchEnd(work, info, r)
		}
	}
	return out
}

// await waits for the transaction, watching the handler's running time.
func (w *worker) await(done <-chan txOutcome, cancel context.CancelFunc, run *txRun, items []item) (txOutcome, bool) {
	limit := w.c.cfg.HandlerTimeout
	tick := time.NewTicker(min(limit/4, time.Second))
	defer tick.Stop()
	var cutoff <-chan time.Time
	for {
		select {
		case out := <-done:
			return out, false
		case <-tick.C:
			since := run.handlerSince.Load()
			if cutoff == nil && since != 0 && time.Since(time.Unix(0, since)) > limit {
				run.timedOut.Store(true)
				cancel()
				cutoff = time.After(handlerCutoffGrace)
			}
		case <-cutoff:
			if c, ok := run.conn.Load().(net.Conn); ok {
				_ = c.Close()
			}
			i := int(run.current.Load())
			msg := &items[i].msg
			err := &MessageError{Topic: w.topic, Partition: w.partition, Offset: msg.Offset, MessageID: msg.ID,
				Err: fmt.Errorf("%w (%v) and did not return within %v after its context was cancelled; it was abandoned and its connection closed", ErrHandlerTimeout, limit, handlerCutoffGrace)}
			w.c.log.Error("handler hung; abandoned it", w.logAttrs(slog.Int64("offset", msg.Offset), slog.String("message_id", msg.ID))...)
			return txOutcome{failedAt: i, err: err, fail: newFailure(classTransient, deadletter.ClassRetriesExhausted, err)}, true
		}
	}
}

// tx runs one transaction: claim the ids, sort out duplicates and conflicts,
// run the handler for each newly claimed message, set aside what p says and
// what fails permanently inside a savepoint, write dead letters, advance the
// stored position, commit. The handler gets hctx; everything else runs on
// ctx, so a handler cut off by the watchdog does not take the transaction's
// own statements with it.
func (w *worker) tx(hctx, ctx context.Context, items []item, p *plan, st *batchState, run *txRun) (out txOutcome) {
	if w.oneTripEligible(items, p) {
		if out, ok := w.oneTrip(hctx, ctx, items, st, run); ok {
			return out
		}
	}
	out.failedAt = -1
	n := len(items)
	st.reset(n)
	for i := range items {
		f := p.deadLetter[i]
		if items[i].idErr != nil {
			st.fates[i], st.fails[i] = fateDeadLettered, f
			continue
		}
		c := dedupe.Claim{MessageID: items[i].msg.ID, Fingerprint: items[i].fp, Offset: items[i].msg.Offset}
		switch {
		case f != nil:
			c.Status, c.Attempts = dedupe.StatusDeadLettered, f.attempts
		case items[i].suspect != nil && w.c.cfg.SuspectDuplicates == SkipSuspects:
			c.Status = dedupe.StatusSuspectDuplicate
		}
		st.claims = append(st.claims, c)
		st.claimItem = append(st.claimItem, i)
	}
	st.claimedBy = resize(st.claimedBy, len(st.claims))

	// One round trip: BEGIN, the session settings, the stored position
	// (locked until COMMIT, so nothing moves it under this transaction) and
	// the claims.
	b := &pgx.Batch{}
	if w.c.sessionSQL != "" {
		b.Queue(w.c.sessionSQL, w.c.sessionArgs...)
	}
	var prev *int64
	w.c.offsets.QueueLock(b, w.c.cfg.Name, w.topic, w.partition, &prev)
	if len(st.claims) > 0 {
		w.c.claims.QueueClaim(b, w.c.cfg.Name, w.topic, w.partition, st.claims, st.claimedBy)
	}
	bt, err := w.c.beginWith(ctx, b)
	if err != nil {
		return infra(fmt.Errorf("begin and claim: %w", err))
	}
	defer bt.rollback(ctx)
	tx := bt.tx
	run.conn.Store(bt.netConn())
	if lost := w.positionLost(prev); lost != nil {
		return txOutcome{failedAt: -1, err: lost, fail: newFailure(classInfra, "", lost), lost: lost}
	}
	w.sawDuplicates = false
	for j, i := range st.claimItem {
		st.claimed[i] = st.claimedBy[j]
		// Duplicates foreseen from memory do not count: a one-trip batch
		// skips those without a claim (see oneTrip).
		w.sawDuplicates = w.sawDuplicates || !st.claimedBy[j] && !foreseen(items, i, w.next)
		switch {
		case !st.claimed[i]:
		case p.deadLetter[i] != nil:
			st.fates[i], st.fails[i] = fateDeadLettered, p.deadLetter[i]
		case st.claims[j].Status == dedupe.StatusSuspectDuplicate:
			st.fates[i] = fateSkippedSuspect
		}
	}
	if res := w.resolveUnclaimed(ctx, tx, items, st); res.err != nil {
		return res
	}

	gtx := txguard.Wrap(tx)
	batched := w.c.cfg.BatchHandler != nil
	var batch *Batch
	if batched {
		var res txOutcome
		if batch, res = w.handleBatch(hctx, ctx, gtx, items, p, st, run); res.err != nil {
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
		run.current.Store(int32(i))
		began := time.Now()
		run.handlerSince.Store(began.UnixNano())
		err := w.callHandler(hctx, gtx, &items[i].msg)
		run.handlerSince.Store(0)
		for _, h := range w.c.hooks.handler {
			h.OnHandlerEnd(ctx, &items[i].msg, time.Since(began), err)
		}
		if err = w.handlerOutcome(err, run, gtx); err == nil {
			continue
		}
		merr, f := w.messageFailure(&items[i].msg, err)
		switch {
		case f.class == classInfra:
			// A deadlock or a lost connection inside the handler is not the
			// message's fault: the whole transaction runs again.
			return infra(merr)
		case !inSavepoint || run.timedOut.Load():
			return txOutcome{failedAt: i, err: merr, fail: f}
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT kafkaonce_message"); err != nil {
			return infra(err)
		}
		if f.class == classPermanent && w.c.cfg.OnPermanentFailure == DeadLetter {
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

	b = &pgx.Batch{}
	// The BatchHandler's queued statements go first, each counting itself
	// done, so that a failure among them is told from one of ours.
	userDone := 0
	if batch != nil {
		for _, q := range batch.queued.QueuedQueries {
			q.Exec(func(pgconn.CommandTag) error { userDone++; return nil })
			b.QueuedQueries = append(b.QueuedQueries, q)
		}
	}
	if len(dlIDs) > 0 {
		w.c.claims.QueueSetStatus(b, w.c.cfg.Name, dlIDs, dlAttempts, dedupe.StatusDeadLettered)
	}
	if cut >= 0 {
		var tail []string
		for i := cut; i < n; i++ {
			if st.claimed[i] {
				tail = append(tail, items[i].msg.ID)
			}
		}
		if len(tail) > 0 {
			w.c.claims.QueueUnclaim(b, w.c.cfg.Name, tail)
		}
	}
	var letters []deadletter.Letter
	for i := range items[:end] {
		if st.fates[i] == fateDeadLettered {
			letters = append(letters, letterFor(&items[i], st.fails[i]))
		}
	}
	if len(letters) > 0 {
		if err := w.c.letters.QueueInsert(b, w.c.cfg.Name, w.topic, w.partition, letters); err != nil {
			return infra(err)
		}
	}
	w.queueSuspects(b, items, st, end)
	if p.clearAttempts {
		w.c.attempts.QueueClear(b, w.c.cfg.Name, w.topic, w.partition, items[0].msg.Offset, items[end-1].msg.Offset)
	}
	w.c.offsets.QueueAdvance(b, w.c.cfg.Name, w.topic, w.partition, items[end-1].msg.Offset+1)
	// One round trip: the queued effects, the closing statements, COMMIT.
	if err := bt.commitWith(ctx, b); err != nil {
		var before *beforeCommitError
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &before) && batch != nil && userDone < batch.nQueue:
			return w.batchFailed(batch, items, before.err)
		case errors.As(err, &before):
			return infra(fmt.Errorf("record position: %w", before.err))
		case errors.As(err, &pgErr):
			// The server answered: the transaction did not commit.
			return infra(fmt.Errorf("commit: %w", err))
		}
		// No answer: the COMMIT may or may not have been applied.
		return w.commitUnknown(items, err)
	}
	out.committed = end
	if cut >= 0 {
		out.failedAt, out.err = cut, out.fail.err
	}
	return out
}

// handleBatch calls the BatchHandler once with every newly claimed message
// before p.savepointFrom (those after it are handled one per call, in
// savepoints, by the loop in tx). It returns the Batch, whose queued
// statements the caller sends with its closing statements.
func (w *worker) handleBatch(hctx, ctx context.Context, gtx *txguard.Tx, items []item, p *plan, st *batchState, run *txRun) (*Batch, txOutcome) {
	b := &w.batchCall
	b.reset(gtx)
	b.index = b.index[:0]
	for i := range items[:p.savepointFrom] {
		if st.fates[i] == fateApplied {
			b.Messages = append(b.Messages, &items[i].msg)
			b.index = append(b.index, i)
		}
	}
	if len(b.Messages) == 0 {
		return nil, txOutcome{failedAt: -1}
	}
	run.current.Store(int32(b.index[0]))
	began := time.Now()
	run.handlerSince.Store(began.UnixNano())
	err := w.c.callBatchHandler(hctx, b)
	run.handlerSince.Store(0)
	w.reportBatchCall(ctx, b, time.Since(began), err)
	if err = w.handlerOutcome(err, run, gtx); err != nil {
		return nil, w.batchFailed(b, items, err)
	}
	return b, txOutcome{failedAt: -1}
}

// reportBatchCall tells the handler hooks about a BatchHandler call that
// took d: each message of the call with an equal share of it.
func (w *worker) reportBatchCall(ctx context.Context, b *Batch, d time.Duration, err error) {
	if len(w.c.hooks.handler) == 0 || len(b.Messages) == 0 {
		return
	}
	share := d / time.Duration(len(b.Messages))
	for _, m := range b.Messages {
		for _, h := range w.c.hooks.handler {
			h.OnHandlerEnd(ctx, m, share, err)
		}
	}
}

// handlerOutcome is what a handler call (of either kind) comes to: its
// error, or one it hid — cut off by the watchdog, an attempt to end the
// transaction, a swallowed SQL error that left the transaction aborted.
func (w *worker) handlerOutcome(err error, run *txRun, gtx *txguard.Tx) error {
	switch {
	case run.timedOut.Load():
		return fmt.Errorf("%w (%v)", ErrHandlerTimeout, w.c.cfg.HandlerTimeout)
	case err == nil && gtx.Misused():
		return ErrTxControlledByConsumer
	case err == nil && gtx.Conn().PgConn().TxStatus() == 'E':
		return ErrTxAborted
	}
	return err
}

// messageFailure names the message in err and classifies it.
func (w *worker) messageFailure(msg *Message, err error) (*MessageError, *failure) {
	merr := &MessageError{Topic: w.topic, Partition: w.partition, Offset: msg.Offset, MessageID: msg.ID, Err: err}
	f := classifyHandlerError(err)
	f.err = merr
	return merr, f
}

// batchFailed is the outcome of a BatchHandler call (or of its queued
// statements) that failed. With one message the failure is that message's;
// with more, the transaction is run again with one message per call.
func (w *worker) batchFailed(b *Batch, items []item, err error) txOutcome {
	if len(b.Messages) == 1 {
		i := b.index[0]
		merr, f := w.messageFailure(&items[i].msg, err)
		if f.class == classInfra {
			return infra(merr)
		}
		return txOutcome{failedAt: i, err: merr, fail: f}
	}
	f := classifyHandlerError(err)
	if f.class == classInfra {
		return infra(err)
	}
	first, last := items[b.index[0]].msg.Offset, items[b.index[len(b.index)-1]].msg.Offset
	return txOutcome{failedAt: -1, isolate: true,
		err: fmt.Errorf("batch handler failed for the %d messages at offsets %d to %d; handling them one at a time: %w", len(b.Messages), first, last, err)}
}

// resolveUnclaimed sorts the messages whose claim found an existing row into
// duplicates (same fingerprint: skipped) and conflicts (different
// fingerprint: set aside, or the transaction fails under StopPartition).
func (w *worker) resolveUnclaimed(ctx context.Context, tx pgx.Tx, items []item, st *batchState) txOutcome {
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
	existing, err := w.c.claims.Lookup(ctx, tx, w.c.cfg.Name, ids)
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
		inBatch := rec.Topic == w.topic && rec.Partition == w.partition && claimedHere(items, st, rec.Offset)
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
		cf := &FingerprintConflictError{Topic: w.topic, Partition: w.partition, Offset: items[i].msg.Offset,
			MessageID: items[i].msg.ID, Fingerprint: items[i].fp, Existing: rec}
		f := newFailure(classPermanent, deadletter.ClassConflict, cf)
		if w.c.cfg.OnPermanentFailure == StopPartition {
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

// callHandler runs the handler (see Consumer.callHandler).
func (w *worker) callHandler(ctx context.Context, tx pgx.Tx, msg *Message) error {
	return w.c.callHandler(ctx, tx, msg)
}

func stack() []byte { return debug.Stack() }

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

// positionLostError: the stored position is behind what this worker
// committed, so the database lost committed transactions (a crash with
// asynchronous commit, a failover to a lagging replica, a restore). Their
// effects, claims and positions are gone together; the worker must fetch
// again from the stored position.
type positionLostError struct {
	stored, believed int64
}

func (e *positionLostError) Error() string {
	return fmt.Sprintf("the stored position is %d but this worker had committed up to %d: the database lost committed transactions; processing again from %d", e.stored, e.believed, e.stored)
}

// positionLost compares the stored position found by a transaction with
// the one this worker committed last.
func (w *worker) positionLost(prev *int64) *positionLostError {
	switch {
	case !w.positionKnown:
		return nil
	case prev == nil:
		return &positionLostError{stored: w.assignedStart, believed: w.next}
	case *prev < w.next:
		return &positionLostError{stored: *prev, believed: w.next}
	}
	return nil
}
