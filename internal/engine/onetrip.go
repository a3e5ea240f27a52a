package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/notx"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// A batch normally costs two round trips: the claims must come back before
// the handler knows which messages are new. Most batches hold only new
// messages, though, and a BatchHandler that only queues its statements needs
// nothing from the database. For those, oneTrip calls the handler first, as
// if every message were new, and sends everything in one pipeline: BEGIN,
// the session settings with the checked advance of the position, claims
// that fail on any id already claimed, the check of foreseen re-sends, the
// queued effects, COMMIT. Whatever should stop the batch raises an error,
// so the server skips the rest, COMMIT included, and the batch then runs
// the ordinary way, which sorts it out.
//
// Duplicates the worker foresees do not stop it. The suspect-duplicate
// window remembers, per content, the id it came with and where it was
// first seen: a message seen again with the same id and content is a
// re-send of a committed message when the first copy is below the
// worker's position, and a repeat when the first copy is earlier in the
// same batch. Both are left out of the handler call and the claims. A
// repeat needs no check (its first copy's claim fails the batch if that id
// is taken); re-sends go to expect_claimed, which fails the batch unless
// each is claimed with the same fingerprint. The order "database
// commit, then offset commit" is unchanged: the Kafka offset is committed by
// the caller after this returns, as for any batch.

// oneTrip tries an eligible attempt in one round trip (see above). ok is
// false when the try was dropped without committing anything; the batch
// then runs the ordinary way (claimFirst).
func (a *txAttempt) oneTrip(hctx, ctx context.Context) (out txOutcome, ok bool) {
	items, st := a.items, a.st
	n := len(items)
	// Duplicates foreseen from memory are skipped without a claim: a
	// re-send of a message this worker committed (expect_claimed checks
	// that it is claimed, with the same content), and a repeat of an
	// earlier message of the batch (whose claim fails the batch if that one
	// is taken).
	var resentIDs []string
	var resentFps []dedupe.Fingerprint
	for i := range items {
		if items[i].resent(a.next) {
			st.fates[i] = fateSkipped
			resentIDs = append(resentIDs, items[i].msg.ID)
			resentFps = append(resentFps, items[i].fp)
			continue
		}
		if j := firstCopyInBatch(items, i); j >= 0 && st.claimed[j] {
			st.fates[i] = fateSkippedInBatch
			continue
		}
		st.claims = append(st.claims, claims.Claim{MessageID: items[i].msg.ID, Fingerprint: items[i].fp, Offset: items[i].msg.Offset})
		st.claimItem = append(st.claimItem, i)
		st.claimed[i] = true // and st.fates[i] is fateApplied
	}

	var b *Batch
	var took time.Duration
	if len(st.claimItem) > 0 {
		msgs := make([]*kafkaoncetype.Message, len(st.claimItem))
		for k, i := range st.claimItem {
			msgs[k] = &items[i].msg
		}
		b = a.user.newBatch(msgs, st.claimItem)
		ahead := &notx.Tx{}
		began := time.Now()
		a.progress.step()
		err := a.user.callBatch(hctx, a.uc, ahead, b)
		took = time.Since(began)
		if errors.Is(err, usercall.ErrAbandoned) {
			return infra(err), true // nobody reads it: the worker has moved on
		}
		if ahead.Used() {
			a.batchUsesTx.Store(true)
			a.log.Info("the batch handler uses Batch.Tx; batches open their transaction before calling it from now on", a.logAttrs()...)
		}
		if err != nil || ahead.Used() || a.uc.TimedOut() {
			// The ordinary way calls the handler again, in an open
			// transaction, and deals with its failure there.
			return txOutcome{}, false
		}
	}

	// Five statements and the handler's (BEGIN, the head, the claims, the
	// closing, COMMIT): as few as the position check, the
	// session settings and the claims allow (on small batches each costs
	// the server about as much as the claim itself).
	sess := a.session()
	if a.racing {
		sess = sess.racing
	}
	q := &pgx.Batch{}
	queueBegin(q)
	head := append(make([]any, 0, len(sess.args)+5), sess.args...)
	q.Queue(sess.oneTripHead, append(head, a.cfg.Name, a.topic, a.partition, a.next, items[n-1].end)...)
	claimed := len(st.claims) == 0
	if !claimed {
		a.claims.QueueClaimNew(q, a.cfg.Name, a.topic, a.partition, st.claims, &claimed)
	}
	if len(resentIDs) > 0 {
		a.claims.QueueExpectClaimed(q, a.cfg.Name, resentIDs, resentFps)
	}
	if b != nil {
		q.QueuedQueries = append(q.QueuedQueries, b.statements()...)
	}
	// The batch's closing fails if a queued COMMIT or ROLLBACK ended the
	// transaction (a queued COMMIT itself is refused: see
	// positions.QueueOpen).
	a.offsets.QueueClose(q, a.cfg.Name, a.topic, a.partition)
	a.queueSuspects(q, n)
	a.queuePace(q)

	bt, err := a.acquire(ctx)
	if err != nil {
		return infra(fmt.Errorf("begin: %w", err)), true
	}
	defer bt.rollback(ctx)
	a.uc.Hold(bt.cutLoose)
	if err := bt.commitWith(ctx, q); err != nil {
		var ce *commitError
		errors.As(err, &ce)
		return a.oneTripFailed(ce, claimed)
	}
	if b != nil {
		a.reportBatchCall(ctx, b, took, nil)
	}
	return txOutcome{committed: n}, true
}

// oneTripFailed says what a one-trip batch that did not commit comes to:
// dropped (ok false) when the ordinary path is to run the batch and sort
// it out, else the outcome. claimed is whether the claims went through.
func (a *txAttempt) oneTripFailed(ce *commitError, claimed bool) (out txOutcome, ok bool) {
	var pgErr *pgconn.PgError
	var pre pgx.ErrPreprocessingBatch
	why := "a queued statement failed"
	switch {
	case ce.unknown():
		return a.commitUnknown(ce.err), true
	case ce.stmt == notSent:
		return infra(fmt.Errorf("commit: nothing was sent: %w", ce.err)), true
	case errors.As(ce.err, &pre), errors.Is(ce.err, pgx.ErrTxCommitRollback):
		// pgx refused to send a statement (an argument it cannot encode,
		// one the server could not prepare), or the block was rolled back
		// at COMMIT: nothing committed. The ordinary path runs the batch
		// and finds the culprit.
		why = "the pipeline was refused"
	case !errors.As(ce.err, &pgErr):
		return infra(ce.err), true
	// The server refused a statement, so it skipped the rest of the
	// pipeline: nothing committed. A claim taken, a position moved or a
	// failing queued statement: the ordinary path runs the batch and
	// sorts it out. Anything else before the claims (a lock or statement
	// timeout, a deadlock, the server going down) would meet the ordinary
	// path too: it is retried as infrastructure, without waiting for it
	// twice.
	case pgErr.Code == positions.CheckFailed:
		why = "the stored position is not where this worker left it"
	case pgErr.Code == claims.ExpectFailed:
		why = "a message taken for a re-send is not claimed with the same content"
	case pgErr.Code == positions.TxEnded:
		why = "a queued statement ended the transaction"
	case pgErr.Code == schema.SessionChanged:
		why = "a queued statement changed a setting the consumer's statements rely on"
	case !claimed && pgErr.Code == "23505":
		why = "a message id was already claimed"
	case !claimed:
		return infra(fmt.Errorf("begin and claim: %w", ce.err)), true
	case isContention(pgErr):
		// Lost a race for rows: the ordinary path would run into the
		// same rows. The worker adapts first (see contention.go).
		return infra(fmt.Errorf("batch: %w", ce.err)), true
	}
	a.log.Debug("one-round-trip attempt dropped; running the batch claim-first", a.logAttrs(
		slog.Int64("offset", a.items[0].msg.Offset), slog.String("why", why), slog.String("error", ce.err.Error()))...)
	return txOutcome{}, false
}
