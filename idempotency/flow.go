package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
)

// DefaultLease is a Flow's lease when Flow.Lease is zero.
const DefaultLease = 30 * time.Second

// A Flow is a request served in phases, for work that cannot be one
// transaction: a call to a card provider, a mail service, any system
// outside Postgres. Each phase commits a recovery point, so a run that
// stops part way (a crash, a failed call, a server killed) is resumed from
// its last recovery point by the next retry of the request, or by the
// recovery sweep (Phased.Recover): it neither starts over nor stays "in
// progress" for ever.
//
// Start runs first, in the transaction that claims the key, and records
// the intent (a payment row in state "pending", say). Then Phases run in
// turn, each chosen by the recovery point the previous one committed:
// Atomic phases in a transaction of their own, External ones outside any
// transaction. The run ends when a phase responds: the response is stored
// with the key, in the same transaction as that phase's rows, and every
// retry gets it.
//
// While a run is in progress its key holds a lease. A retry that comes
// during the lease is answered 409 with a Retry-After that covers it; one
// that comes after the lease ran out (its server died) takes the run over.
type Flow struct {
	// Name names the flow's runs in the idempotency_keys table, so that a
	// flow's recovery sweep resumes only its own runs. It must stay the
	// same across deploys while runs are in progress: letters, digits and
	// ._-, at most 100 bytes. Required.
	Name string

	// Lease is how long a run is its server's between two recovery points:
	// each phase must end within it. Its context's deadline is the lease's
	// end, and after it a retry or the sweep may take the run over and run
	// the phase again. Keep it well above the longest phase (a provider's
	// timeout, say). Defaults to DefaultLease; at least 1s.
	Lease time.Duration

	// Start runs in the transaction that claims the key, with the request.
	// It records the intent with tx and returns Continue with the first
	// recovery point, or Respond to end the run at once (a request it
	// refuses, say). Required.
	Start func(r *http.Request, tx pgx.Tx, run *Run) (Step, error)

	// Phases continue a run, each from the recovery point named by its
	// From. Two phases may not share a From.
	Phases []Phase

	// MaxTakes bounds the times a run is taken (by its first request,
	// then by each resume, a client's retry or the sweep): the take after
	// it gives the run up instead of resuming it. Defaults to
	// DefaultMaxTakes.
	MaxTakes int

	// SweepBackoff is how long the recovery sweep leaves a run alone after
	// one of its phases failed; it doubles with each take, up to
	// MaxSweepBackoff. A client's retry resumes the run at once whatever
	// it says. Defaults to DefaultSweepBackoff.
	SweepBackoff time.Duration

	// GiveUp, when set, decides the response a run that is given up
	// completes its key with, in a transaction that commits it: it may
	// compensate there (mark the payment failed, queue a refund in an
	// outbox). It must Respond with a status that is stored (below 500,
	// and not 408, 409, 425 or 429); if it fails, the run stays, and the
	// next take gives it up again. Without it the key completes with 424
	// and a problem body that says the request was given up.
	GiveUp func(ctx context.Context, tx pgx.Tx, run *Run, reason string) (Step, error)
}

const (
	// DefaultMaxTakes is a Flow's MaxTakes when it is zero.
	DefaultMaxTakes = 10
	// DefaultSweepBackoff is a Flow's SweepBackoff when it is zero.
	DefaultSweepBackoff = time.Second
	// MaxSweepBackoff bounds the sweep's wait for one run.
	MaxSweepBackoff = 10 * time.Minute
)

// sweepDelay is how long the sweep leaves a run alone after a phase of
// its take-th take failed.
func (f *Flow) sweepDelay(taken int) time.Duration {
	d := f.SweepBackoff
	for i := 1; i < taken && d < MaxSweepBackoff; i++ {
		d *= 2
	}
	return min(d, MaxSweepBackoff)
}

// A Phase is one step of a Flow. Exactly one of Atomic and External is set.
//
// A phase may run more than once: again after its server died before its
// recovery point committed, or after the lease ran out while it ran. An
// Atomic phase's writes commit with its recovery point, so they happen
// once; an External phase's call must be idempotent at the other end: send
// Run.DerivedKey as the provider's idempotency key, and the provider
// answers a repeated call with its first result.
type Phase struct {
	// From is the recovery point the phase continues from.
	From string

	// Atomic runs in a transaction that commits its writes with the
	// recovery point (or the response) it returns. It must not commit or
	// roll back tx.
	Atomic func(ctx context.Context, tx pgx.Tx, run *Run) (Step, error)

	// External runs outside any transaction: the call to the outside
	// world. What it returns is committed as the next recovery point (or
	// the response) when it returns.
	External func(ctx context.Context, run *Run) (Step, error)
}

// A Run is a phased request's progress, as a phase sees it. A phase run by
// a resume sees what the one before it left, whichever server ran that.
type Run struct {
	// Scope and Key are the request's idempotency key.
	Scope, Key string
	// Method and Route are the request's.
	Method, Route string
	// Body is the request's body, in Start only. It is not stored: Start
	// puts in State what later phases need (an id, an amount), so that a
	// secret in a body (a card number) is never kept.
	Body []byte
	// Point is the recovery point the phase continues from ("" in Start).
	Point string
	// State is what the previous phase left with Continue.
	State []byte
	// Taken counts the times the run was taken: 1 by its first request,
	// one more at each resume after a lease ran out.
	Taken int

	id string // random, the run's own: see DerivedKey
	// lastError is the last failure of one of the run's phases, as the
	// take found it.
	lastError string
	// giveUp, when set, is why this take gives the run up instead of
	// resuming it.
	giveUp string
}

// DerivedKey is a key for an outside system's idempotency, derived from
// the run and from purpose (say "charge"): the same on every attempt and
// every resume of the run, different for every other request, including a
// later one with the same key after it expired. 64 hex digits.
func (r *Run) DerivedKey(purpose string) string {
	h := sha256.New()
	for _, part := range []string{"kafkaonce/idempotency", r.Scope, r.Key, r.id, purpose} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// A Step is what a phase decided: Continue or Respond.
type Step struct {
	point   string
	state   []byte
	respond bool
	status  int
	header  http.Header
	body    []byte
	// givenUp is why the run was given up, for the response that
	// completes its key as given up; else nil.
	givenUp *string
}

// Continue commits point as the run's recovery point, with state for the
// phase that continues from it.
func Continue(point string, state []byte) Step {
	return Step{point: point, state: state}
}

// Respond ends the run with a response. A response the storing rule keeps
// (see the package documentation) is stored with the key and committed
// with the phase's writes: the run is complete, and every retry gets it. A
// response the rule does not keep (5xx, 408, 409, 425, 429) is sent as it
// is, and the run stays at its recovery point, to be resumed by a retry.
func Respond(status int, header http.Header, body []byte) Step {
	return Step{respond: true, status: status, header: header, body: body}
}

// flowNames are the names a Flow may have.
var flowNames = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// validate checks f and indexes its phases by recovery point.
func (f *Flow) validate() (map[string]Phase, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("idempotency: Flow."+format, args...))
	}
	if !flowNames.MatchString(f.Name) {
		bad("Name %q must be 1 to 100 letters, digits, '.', '_' or '-'", f.Name)
	}
	if f.Lease < time.Second {
		bad("Lease must be at least 1s (got %v)", f.Lease)
	}
	if f.MaxTakes < 1 {
		bad("MaxTakes must be at least 1 (got %d)", f.MaxTakes)
	}
	if f.SweepBackoff <= 0 {
		bad("SweepBackoff must be positive (got %v)", f.SweepBackoff)
	}
	if f.Start == nil {
		bad("Start must be set: it records the request's intent in the transaction that claims its key")
	}
	phases := make(map[string]Phase, len(f.Phases))
	for i, ph := range f.Phases {
		switch {
		case ph.From == "":
			bad("Phases[%d].From must name the recovery point the phase continues from", i)
		case ph.Atomic == nil == (ph.External == nil):
			bad("Phases[%d] (From %q) must set exactly one of Atomic and External", i, ph.From)
		}
		if _, dup := phases[ph.From]; dup {
			bad("Phases[%d]: two phases continue from %q", i, ph.From)
		}
		phases[ph.From] = ph
	}
	return phases, errors.Join(errs...)
}

// check returns why a phase's step cannot be followed, or nil.
func (p *Phased) check(s Step) error {
	switch {
	case s.respond && (s.status < 200 || s.status > 999):
		return fmt.Errorf("Respond(%d): a response needs a final status, 200 to 999", s.status)
	case s.respond:
		return nil
	case s.point == "":
		return errors.New("the phase returned neither Continue nor Respond")
	}
	if _, ok := p.phases[s.point]; !ok {
		return fmt.Errorf("Continue(%q): no phase of flow %q continues from it", s.point, p.flow.Name)
	}
	return nil
}
