// Package usercall is the one place kafkaonce runs code it did not write:
// handlers, whether the consumer's workers call them, a redrive does, or
// consumertest. Every call gets the same rules:
//
//   - a panic becomes an error wrapping ErrPanicked, with the stack;
//   - the transaction it gets cannot be committed or rolled back by it, and
//     refuses every use once the call is over (see internal/txguard);
//   - a handler that returns nil while its transaction is aborted (it
//     swallowed a SQL error) has failed, with ErrTxAborted; one that ended
//     the transaction with a COMMIT or ROLLBACK statement, with
//     txguard.ErrTxControlled; one that left a query's rows open, with
//     ErrRowsLeftOpen;
//   - a call that runs past Limits.Timeout has its context cancelled, and
//     if it has not returned Limits.Grace later, or Grace after the
//     caller's own context ended, the attempt's connection is closed (the
//     server rolls its transaction back) and the attempt is abandoned.
//
// Run runs a whole attempt — the transaction and every call in it — on a
// goroutine of its own, so that what is abandoned is the attempt and
// everything it holds: the caller never touches that attempt's connection,
// transaction or state again, and the attempt, once its call returns,
// learns that it was abandoned and ends without writing anything.
package usercall

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/notx"
	"github.com/kafkaonce/kafkaonce/internal/txguard"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

var (
	// ErrPanicked wraps the value of a handler's panic.
	ErrPanicked = kafkaoncetype.ErrHandlerPanicked
	// ErrTimeout means the handler ran longer than its timeout.
	ErrTimeout = kafkaoncetype.ErrHandlerTimeout
	// ErrTxAborted means the handler returned nil, but a statement in its
	// transaction had failed, so the transaction could not commit.
	ErrTxAborted = kafkaoncetype.ErrTxAborted
	// ErrTxEnded means the handler's transaction was ended by a statement
	// the guard did not send (one sent on the connection around it). It
	// wraps txguard.ErrTxControlled.
	ErrTxEnded = kafkaoncetype.ErrTxEnded
	// ErrRowsLeftOpen means the handler returned with the rows of a query
	// still open (rows.Close was not called, or the rows were not read to
	// the end): the connection can run nothing else, so the transaction
	// cannot go on.
	ErrRowsLeftOpen = kafkaoncetype.ErrRowsLeftOpen
	// ErrAbandoned is what a call returns, once it does return, in an
	// attempt that was abandoned meanwhile: the attempt must end at once.
	ErrAbandoned = errors.New("the handler's attempt was abandoned while the handler ran")
)

// Limits bound the calls of an attempt.
type Limits struct {
	// Timeout bounds one call; then its context is cancelled.
	Timeout time.Duration
	// Grace is how long a call whose context was cancelled may take to
	// return before its attempt is abandoned.
	Grace time.Duration
}

// Phases of an attempt, moved only by compare-and-swap so that a call
// returning and the watchdog giving up on it cannot both win.
const (
	phaseIdle int32 = iota
	phaseCalling
	phaseCutting // the watchdog gave up on the call and is cutting it loose
	phaseAbandoned
)

// Attempt is one attempt's state, shared by the goroutine running it and
// the watchdog in Run. Run makes one per attempt; nothing reuses it.
type Attempt struct {
	limits Limits
	phase  atomic.Int32
	// since is when the current call started, counted from began on the
	// monotonic clock: a step of the wall clock cuts off nothing.
	began    time.Time
	since    atomic.Int64
	index    atomic.Int32 // the (first) item the current call is for
	count    atomic.Int32 // how many items the current call is for
	timedOut atomic.Bool
	cut      atomic.Pointer[func()]
	guard    atomic.Pointer[txguard.Tx] // the current call's
	// check is the commit check of the attempt's transaction, which the
	// guard lifts around a handler's SET CONSTRAINTS (see txguard.CommitCheck);
	// nil when it has none.
	check *txguard.CommitCheck
	// cutDone is closed once an abandoned attempt was cut loose.
	cutDone chan struct{}
}

// Hold says how to let go of what the attempt holds if it is abandoned:
// cut closes the connection of its transaction, so that the server rolls
// it back and releases its locks, and gives back what the connection
// takes (its slot in a pool), so that a hung handler keeps nothing the
// rest of the process needs. cut runs on the watchdog's goroutine while
// the attempt's is held in user code, and before that goroutine learns
// that it was abandoned: what cut changes, the attempt then sees.
func (a *Attempt) Hold(cut func()) { a.cut.Store(&cut) }

// SetConn is Hold with a cut that closes c.
func (a *Attempt) SetConn(c net.Conn) { a.Hold(func() { _ = c.Close() }) }

// SetCommitCheck names the commit check of the transaction the attempt's
// calls get, for the guard around it. Set it before the first call.
func (a *Attempt) SetCommitCheck(c *txguard.CommitCheck) { a.check = c }

// TimedOut reports whether a call of this attempt ran past the timeout.
// The transaction should then end: the handler may have left it anywhere.
func (a *Attempt) TimedOut() bool { return a.timedOut.Load() }

// Call runs fn, user code, for the item at index i (the one named if the
// call hangs), with tx guarded, and returns what the call comes to: fn's
// error, or ErrTimeout, txguard.ErrTxControlled, ErrTxAborted or a panic
// it hid. ErrAbandoned means the attempt was given up on while fn ran: the
// caller must return at once. tx may be a notx.Tx (no transaction yet).
func (a *Attempt) Call(ctx context.Context, i int, tx pgx.Tx, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return a.CallFor(ctx, i, 1, tx, fn)
}

// CallFor is Call for a call over n items, the first at index i (a batch
// handler's): if it hangs, Abandoned says so, and which item hung is not
// known.
func (a *Attempt) CallFor(ctx context.Context, i, n int, tx pgx.Tx, fn func(ctx context.Context, tx pgx.Tx) error) error {
	g := txguard.Wrap(tx)
	if a.check != nil {
		g = txguard.WrapChecked(tx, a.check)
	}
	a.guard.Store(g)
	a.index.Store(int32(i))
	a.count.Store(int32(n))
	a.since.Store(int64(time.Since(a.began)))
	if !a.phase.CompareAndSwap(phaseIdle, phaseCalling) {
		return ErrAbandoned
	}
	err := protect(ctx, g, fn)
	g.Seal()
	if !a.phase.CompareAndSwap(phaseCalling, phaseIdle) {
		<-a.cutDone
		return ErrAbandoned
	}
	switch {
	case a.timedOut.Load():
		return fmt.Errorf("%w (%v)", ErrTimeout, a.limits.Timeout)
	case err == nil && g.Misused():
		return txguard.ErrTxControlled
	}
	c := conn(tx)
	if c == nil {
		return err
	}
	if c.PgConn().IsBusy() {
		// A statement's rows are still open: the connection can do
		// nothing else until they are closed, the consumer's statements
		// included.
		return ErrRowsLeftOpen
	}
	switch c.PgConn().TxStatus() {
	case 'I':
		// Not in a transaction any more: a COMMIT or ROLLBACK the guard
		// did not send ended it.
		return ErrTxEnded
	case 'E':
		if err == nil {
			return ErrTxAborted
		}
	}
	return err
}

// protect calls fn, turning a panic into an error that keeps the stack.
func protect(ctx context.Context, tx pgx.Tx, fn func(ctx context.Context, tx pgx.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v\n%s", ErrPanicked, r, debug.Stack())
		}
	}()
	return fn(ctx, tx)
}

// conn is tx's open connection, or nil.
func conn(tx pgx.Tx) *pgx.Conn {
	if _, notOpen := tx.(*notx.Tx); notOpen {
		return nil
	}
	c := tx.Conn()
	if c == nil || c.IsClosed() {
		return nil
	}
	return c
}

// Abandoned describes an attempt given up on.
type Abandoned struct {
	// Index is the item the hung call was for: the first of Count.
	Index, Count int
	// TimedOut means the call ran past the timeout (otherwise the caller's
	// context ended and the call did not return within the grace).
	TimedOut bool
	limits   Limits
}

// Err says what happened, wrapping ErrTimeout when the call timed out and
// ErrAbandoned otherwise.
func (ab *Abandoned) Err() error {
	if ab.TimedOut {
		return fmt.Errorf("%w (%v) and did not return within %v after its context was cancelled; it was abandoned and its connection closed", ErrTimeout, ab.limits.Timeout, ab.limits.Grace)
	}
	return fmt.Errorf("%w: it did not return within %v after its context was cancelled (shutting down); its connection was closed", ErrAbandoned, ab.limits.Grace)
}

// Run runs body, an attempt that calls user code through the Attempt it
// gets, on a goroutine of its own, and returns its result. body gets two
// contexts: hctx for the calls (the watchdog cancels it) and ctx, the
// caller's, for the attempt's own statements.
//
// If a call outlives its limits (see the package documentation), Run
// closes the attempt's connection and returns the zero T and a non-nil
// *Abandoned without waiting for body, which ends on its own: its call
// gets ErrAbandoned when it finally returns, and its transaction is gone
// with the connection.
func Run[T any](ctx context.Context, l Limits, body func(hctx, ctx context.Context, a *Attempt) T) (T, *Abandoned) {
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a := &Attempt{limits: l, began: time.Now(), cutDone: make(chan struct{})}
	done := make(chan T, 1)
	go func() { done <- body(hctx, ctx, a) }()
	tick := time.NewTicker(max(min(l.Timeout/4, time.Second), time.Millisecond))
	defer tick.Stop()
	var cutoff <-chan time.Time
	stopping := ctx.Done()
	for {
		select {
		case out := <-done:
			return out, nil
		case <-stopping:
			stopping = nil
		case <-tick.C:
		case <-cutoff:
			if a.phase.CompareAndSwap(phaseCalling, phaseCutting) {
				// The hung call's transaction refuses from now on, and
				// its connection goes: nothing it does later can land.
				a.guard.Load().Seal()
				if cut := a.cut.Load(); cut != nil {
					(*cut)()
				}
				a.phase.Store(phaseAbandoned)
				close(a.cutDone)
				var zero T
				return zero, &Abandoned{Index: int(a.index.Load()), Count: int(a.count.Load()), TimedOut: a.timedOut.Load(), limits: l}
			}
			cutoff = nil // the call returned in time; the attempt goes on
		}
		if cutoff == nil && a.phase.Load() == phaseCalling {
			overdue := time.Since(a.began)-time.Duration(a.since.Load()) > l.Timeout
			if overdue || ctx.Err() != nil {
				if overdue {
					a.timedOut.Store(true)
				}
				cancel()
				cutoff = time.After(l.Grace)
			}
		}
	}
}
