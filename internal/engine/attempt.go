package engine

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/internal/pace"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/store/letters"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// txDeps are what a batch's transaction reaches of the consumer, and
// nothing else: how transactions begin (database), the settings, the
// user's code and hooks, and the four stores it writes. The worker's
// other state (the Kafka client, the pauses, the breaker, Health) is out
// of its reach: what the transaction did comes back in its txOutcome.
type txDeps struct {
	*database
	cfg      *Config
	log      *slog.Logger
	hooks    *Hooks
	user     *userCode
	claims   *claims.Store
	offsets  *positions.Store
	letters  *letters.Store
	attempts *attempts.Store
	// batchUsesTx is the consumer's: set once its BatchHandler used
	// Batch.Tx during a one-trip attempt (see oneTrip).
	batchUsesTx *atomic.Bool
}

// txDeps hands a transaction attempt its reach.
func (d *deps) txDeps() txDeps {
	return txDeps{database: d.database, cfg: &d.cfg, log: d.log, hooks: &d.hooks, user: &d.user,
		claims: d.claims, offsets: d.offsets, letters: d.letters, attempts: d.attempts, batchUsesTx: &d.batchUsesTx}
}

// txAttempt is one try at one transaction of a partition: what it needs
// from the worker, copied when it starts, and the state it fills in. It
// runs on a goroutine of its own (see runTx), where the handler watchdog
// may abandon it, so it shares nothing the worker goes on changing: every
// attempt is a new txAttempt with its own copy of the plan, its own Batch
// for the handler, and scratch space that is reused only after the attempt
// that had it returned. An abandoned attempt, when its handler finally
// returns, sees usercall.ErrAbandoned and ends without a write.
type txAttempt struct {
	txDeps
	// openCall ends the scope of the handler call in progress, if any: the
	// worker ends it when it abandons the attempt, since the call may
	// never return.
	openCall atomic.Pointer[func(error)]
	// progress is the worker's: each handler call is a step (nil in the
	// engine's table tests).
	progress  *progress
	topic     string
	partition int
	items     []item
	p         plan
	uc        *usercall.Attempt
	st        *batchState

	// What the worker knew when the attempt started.
	next          int64 // its position: where its last commit left the partition
	positionKnown bool  // whether a stored position exists
	// origin is the partition's first start, -1 when not known: where
	// processing starts again if the stored position is gone (see
	// restartAfterLoss).
	origin        int64
	sawDuplicates bool // the previous batch held unforeseen duplicates
	// serialized means the transaction takes the consumer's gate first.
	// racing: it does not, and covers several messages: it gives up a lock
	// wait early (see pace.RaceLockTimeout).
	serialized, racing bool
	// paceRow, when set, is written to the run's record with the commit.
	paceRow *attempts.Pace
	// stored is the stored position the transaction read (nil when there
	// is none).
	stored *int64
	// shareKey is set for a share group member's transaction (see
	// share.go): the transaction has no stored position to lock, check or
	// advance (a share group has none), and it opens its batch under the
	// member's own key (see openTopic). "" for a consumer group's.
	shareKey string
	// conn is the connection of the attempt's transaction, once it began:
	// whether it broke tells a failure of the database's from one of the
	// handler's own (see connLost).
	conn *pgconn.PgConn
}

// fate is what a transaction did with one message.
type fate uint8

const (
	fateApplied fate = iota
	fateSkipped
	fateSkippedInBatch
	fateDeadLettered
	fateSkippedSuspect
)

// batchState is a transaction attempt's scratch space.
type batchState struct {
	claims     []claims.Claim
	claimItem  []int // claims[j] is for items[claimItem[j]]
	claimedBy  []bool
	claimed    []bool
	fates      []fate
	fails      []*failure // why fateDeadLettered messages were set aside
	conflicts  []*kafkaoncetype.FingerprintConflictError
	failedInTx []int // messages that failed inside a savepoint and were set aside
	// sawDuplicates means the batch held messages already claimed that were
	// not foreseen, so the next one probably does too and claims first
	// (see oneTrip).
	sawDuplicates bool
}

func (st *batchState) reset(n int) {
	st.claims, st.claimItem = st.claims[:0], st.claimItem[:0]
	st.claimed = resize(st.claimed, n)
	st.claimedBy = resize(st.claimedBy, n) // cut to the claims' number once they are known
	st.fates = resize(st.fates, n)
	st.fails = resize(st.fails, n)
	st.conflicts, st.failedInTx = st.conflicts[:0], st.failedInTx[:0]
}

// runTx runs one transaction over items per p, between the batch hooks, as
// an attempt on a goroutine of its own (see txAttempt), so that a handler
// that hangs, ignoring its context, can be cut off: after HandlerTimeout its
// context is cancelled, and if it has not returned handlerCutoffGrace later,
// its connection is closed (the server rolls the transaction back) and the
// attempt is abandoned. It hands on the messages the transaction committed
// (afterCommit) inside the batch's scope, whose hooks see them.
func (w *worker) runTx(work context.Context, items []item, p *plan, attempt int) txOutcome {
	items = items[:p.n]
	serialized, limit, paceRow := w.paceNow()
	info := kafkaoncetype.BatchInfo{Topic: w.topic, Partition: w.partition, FirstOffset: items[0].msg.Offset,
		LastOffset: items[len(items)-1].msg.Offset, Size: len(items), Attempt: attempt, HighWaterMark: w.hwm,
		Serialized: serialized, BatchLimit: limit}
	work, endScope := w.hooks.enterBatch(work, info, items)
	defer endScope()
	for _, h := range w.hooks.Start {
		h(work, info)
	}
	began := time.Now()
	a := &txAttempt{txDeps: w.txDeps(), progress: w.progress, topic: w.topic, partition: w.partition, items: items, p: p.clone(),
		next: w.next, positionKnown: w.positionKnown, origin: w.origin, sawDuplicates: w.sawDuplicates,
		st: w.scratch, serialized: info.Serialized, racing: !serialized && len(items) > 1, paceRow: paceRow}
	if a.st == nil {
		a.st = &batchState{}
	}
	w.scratch = nil
	out, abandoned := usercall.Run(work, w.user.limits, func(hctx, ctx context.Context, uc *usercall.Attempt) txOutcome {
		a.uc = uc
		if w.batchCheck == nil {
			w.batchCheck = w.offsets.CommitCheck(w.cfg.Name, w.topic, w.partition)
		}
		uc.SetCommitCheck(w.batchCheck)
		out := a.tx(hctx, ctx)
		out.st = a.st
		return out
	})
	if abandoned != nil {
		if end := a.openCall.Load(); end != nil {
			(*end)(usercall.ErrAbandoned)
		}
		// The abandoned attempt keeps its scratch space, and the handler
		// may still read the messages: the next fetch gets new buffers.
		w.items = nil
		out = a.abandonedOutcome(abandoned)
	} else {
		w.scratch = out.st
		w.sawDuplicates = out.st.sawDuplicates
	}
	took := time.Since(began)
	if out.committed > 0 && a.paceRow != nil {
		w.paceShown = *a.paceRow
	}
	if out.kind == gateBusy {
		w.raceUntil = time.Now().Add(pace.GateBypass)
	}
	w.paced(work, info, &out, took)
	if len(w.hooks.End) > 0 {
		r := out.batchResult(took)
		for _, h := range w.hooks.End {
			h(work, info, r)
		}
	}
	if out.committed > 0 {
		w.afterCommit(work, items[:out.committed], p, out.st)
	}
	return out
}

// batchResult is what HookBatchEnd is told of a transaction that took
// took and ended as out.
func (out *txOutcome) batchResult(took time.Duration) kafkaoncetype.BatchResult {
	r := kafkaoncetype.BatchResult{Duration: took, Err: out.err, Committed: out.committed}
	if out.st != nil {
		for _, f := range out.st.fates[:out.committed] {
			switch f {
			case fateApplied:
				r.Applied++
			case fateDeadLettered:
			default:
				r.Skipped++
			}
		}
	}
	return r
}

// abandonedOutcome is the outcome of an attempt whose handler hung: the
// message it was handling failed. A BatchHandler call over several
// messages does not say which of them hung: they run again one per call,
// as after a call that failed (see batchFailed), and none is blamed yet.
func (a *txAttempt) abandonedOutcome(ab *usercall.Abandoned) txOutcome {
	msg := &a.items[ab.Index].msg
	if ab.Count > 1 {
		a.log.Error("batch handler hung; abandoned it, and handling its messages one at a time", a.logAttrs(
			slog.Int64("offset", msg.Offset), slog.Int("messages", ab.Count), slog.Bool("timed_out", ab.TimedOut))...)
		return txOutcome{kind: isolate, err: fmt.Errorf("batch handler hung on the %d messages from offset %d; handling them one at a time: %w",
			ab.Count, msg.Offset, ab.Err())}
	}
	err := &kafkaoncetype.MessageError{Topic: a.topic, Partition: a.partition, Offset: msg.Offset, MessageID: msg.ID, Err: ab.Err()}
	a.log.Error("handler hung; abandoned it", a.logAttrs(slog.Int64("offset", msg.Offset), slog.String("message_id", msg.ID),
		slog.Bool("timed_out", ab.TimedOut))...)
	return failedMessage(ab.Index, err, newFailure(classTransient, deadletter.ClassRetriesExhausted, err))
}

// tx runs the attempt's transaction: in one round trip when the attempt
// allows it and the try is not dropped (see oneTrip), else claim first,
// each with the attempt's scratch space emptied.
func (a *txAttempt) tx(hctx, ctx context.Context) txOutcome {
	if a.oneTripEligible() {
		a.st.reset(len(a.items))
		if out, ok := a.oneTrip(hctx, ctx); ok {
			return out
		}
	}
	a.st.reset(len(a.items))
	return a.claimFirst(hctx, ctx)
}

// oneTripEligible reports whether the attempt may be tried in one round
// trip: a BatchHandler that has not needed Tx (and no Config.ClaimFirst), a
// transaction that does not take the consumer's gate, a
// plain plan (no savepoints, nothing to set aside, no attempts to clear),
// valid ids, no suspect to skip, no duplicates in the previous batch and a
// known stored position.
func (a *txAttempt) oneTripEligible() bool {
	if a.cfg.HandleBatch == nil || a.cfg.ClaimFirst || a.batchUsesTx.Load() || !a.positionKnown || a.positionless() {
		return false
	}
	if a.serialized {
		// The gate is waited for in a round trip of its own (see begin).
		return false
	}
	if a.p.savepointFrom < len(a.items) || len(a.p.deadLetter) > 0 || a.p.clearAttempts {
		return false
	}
	if a.sawDuplicates {
		// Unforeseen duplicates come in runs (a replay, a producer
		// re-sending a range from before this worker's time): an attempt
		// would most likely fail, costing a round trip and a handler call.
		// The ordinary path tells when the run is over.
		return false
	}
	for i := range a.items {
		if a.items[i].idErr != nil || a.items[i].suspect != nil && a.cfg.SuspectDuplicates == kafkaoncetype.SkipSuspects {
			return false
		}
	}
	return true
}

// clone copies p for an attempt, so that the worker may change its own
// (set a message aside, cut the plan) while an abandoned attempt still
// reads the copy.
func (p *plan) clone() plan {
	c := *p
	c.deadLetter = maps.Clone(p.deadLetter)
	c.savepointFrom = min(c.savepointFrom, c.n)
	return c
}

// positionless reports whether the attempt is a share group member's,
// which has no stored position.
func (a *txAttempt) positionless() bool { return a.shareKey != "" }

// openTopic is the topic the attempt opens its batch under (see
// positions.QueueOpen): its own, or for a share group member its own with
// the member's key, since the members sharing a partition run
// transactions over it at once and must not queue on one another's open
// batch.
func (a *txAttempt) openTopic() string {
	if a.shareKey == "" {
		return a.topic
	}
	return a.topic + " (share member " + a.shareKey + ")"
}

func (a *txAttempt) logAttrs(extra ...any) []any {
	return append([]any{slog.String("topic", a.topic), slog.Int("partition", a.partition)}, extra...)
}

// messageFailure names the message in err and classifies it.
func (a *txAttempt) messageFailure(msg *kafkaoncetype.Message, err error) (*kafkaoncetype.MessageError, *failure) {
	merr := &kafkaoncetype.MessageError{Topic: a.topic, Partition: a.partition, Offset: msg.Offset, MessageID: msg.ID, Err: err}
	f := a.classify(err)
	f.err = merr
	return merr, f
}

// classify sorts err, what a handler's call (or its statements) in the
// attempt's transaction came to.
func (a *txAttempt) classify(err error) *failure {
	return a.cfg.retryLater(classifyHandlerError(err, a.connLost()))
}

// connLost reports whether the connection of the attempt's transaction
// broke. pgx marks a connection closed when its network I/O fails (a
// reset, an EOF, a deadline that interrupted a read) or the server ends
// the session (a FATAL error), before the call that met the failure
// returns: a handler whose query failed that way returns to find it
// closed. A handler's own network call (an HTTP request, a connection of
// its own) leaves it open.
func (a *txAttempt) connLost() bool { return a.conn != nil && a.conn.IsClosed() }

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
