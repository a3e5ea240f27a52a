package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A run is given up when a take would exceed its flow's MaxTakes, or when
// an operator asks (Phased.GiveUp): instead of resuming it, the take runs
// the flow's GiveUp in a transaction of its own and completes the key with
// the response it chose, recording when and why. From then on every retry
// of the key gets that response, and the sweep never takes the run again.
// Giving up is a phase like any other: it commits only while the take's
// lease holds, so a run is given up once, and never while it is resumed.

// givingUp is the phase a take runs instead of the run's own when it gives
// the run up.
func (p *Phased) givingUp() Phase {
	return Phase{From: "(giving up)", Atomic: func(ctx context.Context, tx pgx.Tx, run *Run) (Step, error) {
		step := givenUpResponse(run)
		if p.flow.GiveUp != nil {
			var err error
			if step, err = p.flow.GiveUp(ctx, tx, run, run.giveUp); err != nil {
				return Step{}, fmt.Errorf("Flow.GiveUp: %w", err)
			}
			if !step.respond || !storable(step.status) {
				return Step{}, fmt.Errorf("Flow.GiveUp must Respond with a status that is stored (below 500, not 408, 409, 425 or 429); it returned %s", describeStep(step))
			}
		}
		reason := run.giveUp
		step.givenUp = &reason
		return step, nil
	}}
}

// givenUpResponse is a given-up run's response when its flow has no
// GiveUp: 424, since what the request depended on kept failing. The reason
// is not in it: it may quote a provider, and is for operators.
func givenUpResponse(run *Run) Step {
	body := fmt.Appendf(nil, `{"type":"about:blank","title":"Request given up","status":424,"detail":"the request was given up after %d attempts, and nothing more will be done for it: send a new request with a new key"}`, run.Taken)
	return Respond(http.StatusFailedDependency, http.Header{"Content-Type": {"application/problem+json"}}, body)
}

// describeStep says what a step is, for errors.
func describeStep(s Step) string {
	if s.respond {
		return fmt.Sprintf("Respond(%d)", s.status)
	}
	return fmt.Sprintf("Continue(%q)", s.point)
}

// ErrRunNotIdle is returned by Phased.GiveUp for a key whose run is not
// waiting to be resumed: its lease is live (a server is running it), it
// has no run of this flow, or it is complete.
var ErrRunNotIdle = errors.New("idempotency: no run of this flow waits to be resumed under that key (its lease is live, or it is complete, or it does not exist)")

// GiveUp gives up the run of the key (scope, key), with reason, as a take
// beyond MaxTakes does: the flow's GiveUp decides the response its key
// completes with. Only a run whose lease ran out can be given up; for any
// other it returns ErrRunNotIdle and changes nothing. It returns the
// status the key completed with.
func (p *Phased) GiveUp(ctx context.Context, scope, key, reason string) (int, error) {
	if reason == "" {
		return 0, errors.New("idempotency: GiveUp: reason must say why the run is given up")
	}
	token := newToken()
	b := &pgx.Batch{}
	var took bool
	var waited time.Duration
	run := &Run{Scope: scope, Key: key}
	p.s.keys.queueTakeOver(b, p.flow.Name, scope, key, token, p.flow.Lease, byOperator, &took, &waited, run)
	sent := time.Now()
	if err := withConn(ctx, p.s.db, func(c *pgxpool.Conn) error { return c.SendBatch(ctx, b).Close() }); err != nil {
		return 0, fmt.Errorf("idempotency: GiveUp: take the run over: %w", err)
	}
	if !took {
		return 0, ErrRunNotIdle
	}
	run.giveUp = reason
	res := p.advance(ctx, run, token, sent.Add(waited))
	if res.outcome != completed {
		return 0, fmt.Errorf("idempotency: GiveUp: the run stays: %w", resultErr(res))
	}
	return res.step.status, nil
}

// resultErr is why a run's go did not complete it.
func resultErr(res result) error {
	switch {
	case res.err != nil:
		return res.err
	case res.outcome == lost:
		return errors.New("another server took the run over")
	default:
		return fmt.Errorf("it answered %d, which is not stored", res.step.status)
	}
}
