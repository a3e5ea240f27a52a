package engine

import (
	"context"
	"log/slog"

	"github.com/kafkaonce/kafkaonce/internal/retry"
)

// A ladder is how a partition gets past a transaction that failed, the same
// for a batch (apply), a message alone (runAlone) and a message set aside
// (setAside): run the transaction; hand on what it committed; end the run
// when it must end (shutdown or revocation, a lost position, a stopped
// partition); else wait before the next try. A transaction that failed as a
// whole waits briefly after a lost race (it is nobody's fault, and the
// other transaction is about to finish), or after the next of the
// infrastructure's backoff. What a message's own failure leads to is the
// caller's: the three differ there, and only there.
type ladder struct {
	w *worker
	// backoff spaces retries after failures of the infrastructure and of
	// handlers; short spaces retries after lost races.
	backoff, short *retry.Backoff
	// lost counts the races lost in a row.
	lost int
}

func (w *worker) newLadder() *ladder {
	return &ladder{w: w, backoff: w.retry.New(), short: contentionWaits.New()}
}

// step runs one transaction over items[:p.n], which hands on the messages
// it committed. err is set when the partition's run must end; out says
// what happened otherwise.
func (l *ladder) step(work context.Context, items []item, p *plan, attempt int) (out txOutcome, err error) {
	out = l.w.runTx(work, items, p, attempt)
	if out.committed > 0 {
		l.backoff.Reset()
		l.short.Reset()
		l.lost = 0
	}
	return out, endOfRun(work, &out)
}

// endOfRun is the error that ends the partition's run after out, or nil
// when the partition goes on.
func endOfRun(work context.Context, out *txOutcome) error {
	switch {
	case out.kind == succeeded:
		return nil
	case work.Err() != nil:
		// The shutdown grace ran out mid-transaction: it rolled back (or
		// its COMMIT outcome is unknown); either way the next owner of the
		// partition finds the truth in the claims.
		return work.Err()
	case out.kind == positionLost, out.kind == stopped:
		return out.err
	}
	return nil
}

// again waits before a transaction that failed as a whole (what says what
// it was doing, at offset) runs again: not at all when it gave up waiting
// for the consumer's gate (nothing ran, and the next one races), briefly
// after a lost race, else after the next of the backoff, with a warning.
func (l *ladder) again(stop context.Context, offset int64, what string, out *txOutcome) error {
	wait := l.waitFor(out.kind)
	switch {
	case wait == nil:
		return nil
	case out.kind == lostRace:
		l.lost++
		l.w.warnIfStuck(offset, l.lost, out.err)
	default:
		l.w.log.Warn(what+" failed; retrying", l.w.logAttrs(slog.Int64("offset", offset),
			slog.String("class", classInfra.String()), slog.String("error", out.err.Error()))...)
	}
	return l.pause(stop, wait)
}

// waitFor is the backoff a transaction that failed as a whole, as kind
// says, waits on before it runs again; nil when it runs again at once.
func (l *ladder) waitFor(kind outcomeKind) *retry.Backoff {
	switch kind {
	case gateBusy:
		return nil
	case lostRace:
		return l.short
	}
	return l.backoff
}

// retryAfterFailure waits before a message that failed is tried again.
func (l *ladder) retryAfterFailure(stop context.Context) error { return l.pause(stop, l.backoff) }

func (l *ladder) pause(stop context.Context, b *retry.Backoff) error {
	if retry.Sleep(stop, b.Next()) != nil {
		return errInterrupted
	}
	l.w.progress.step()
	return nil
}

// retryUntil runs fn, a step of the partition's own bookkeeping (reading
// its position, recording its start or an attempt), until it succeeds,
// backing off between failures and warning with what, or until stop (then
// it returns errInterrupted).
func (w *worker) retryUntil(stop context.Context, what string, fn func() error) error {
	backoff := w.retry.New()
	for {
		err := fn()
		if err == nil {
			return nil
		}
		if stop.Err() != nil {
			return errInterrupted
		}
		w.log.Warn(what+"; retrying", w.logAttrs(slog.String("error", err.Error()))...)
		if retry.Sleep(stop, backoff.Next()) != nil {
			return errInterrupted
		}
		w.progress.step()
	}
}
