package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Phased serves a Flow: an http.Handler whose requests run in phases with
// recovery points, and the recovery sweep that resumes the runs their
// servers left. Create one with Server.Phased.
type Phased struct {
	s      *Server
	flow   Flow
	phases map[string]Phase
}

// maxPhases bounds the phases one run goes through in one go: a flow whose
// phases continue each other for ever fails instead of spinning.
const maxPhases = 1000

// Phased validates f and returns its handler. Every request it serves
// needs a key, whatever its method and Config.RequireKey: the key is what
// a resume finds the run by.
func (s *Server) Phased(f Flow) (*Phased, error) {
	if f.Lease == 0 {
		f.Lease = DefaultLease
	}
	if f.MaxTakes == 0 {
		f.MaxTakes = DefaultMaxTakes
	}
	if f.SweepBackoff == 0 {
		f.SweepBackoff = DefaultSweepBackoff
	}
	phases, err := f.validate()
	if err != nil {
		return nil, err
	}
	return &Phased{s: s, flow: f, phases: phases}, nil
}

// outcome is how far a run went in one go.
type outcome int

const (
	completed   outcome = iota // a response was stored: the key is complete
	answered                   // a response not to be stored was sent; the run stays at its recovery point
	failed                     // a phase failed; the run stays at its recovery point, its lease released
	lost                       // another server took the run over
	unreachable                // the database failed; the run is where its last commit left it
)

// ServeHTTP serves a request of the flow: it starts a run, resumes one
// whose lease ran out, or answers as a plain handler would (replay, 409,
// 422).
func (p *Phased) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := p.s
	k, ok := s.admit(w, r, true)
	if !ok {
		return
	}
	ctx := r.Context()
	wait := s.newWait()
	var t *requestTx
	var row *stored
	for {
		var got bool
		var err error
		t, err = s.begin(ctx, func(b *pgx.Batch, idle string) opening {
			return s.queueClaim(b, k, idle, wait.lockWait(s.cfg.InProgressWait), &got, &row)
		})
		if t == nil {
			s.unavailable(w, r, "begin", err)
			return
		}
		switch {
		case err == nil && row != nil && row.run != nil &&
			(row.run.leaseLeft > 0 || row.run.flow != p.flow.Name || !bytes.Equal(row.fingerprint, k.row.fingerprint)):
			t.end(ctx)
			// Its run is live: with InProgressWait, this request waits for
			// it to complete, and replays its response.
			if row.run.flow == p.flow.Name && bytes.Equal(row.fingerprint, k.row.fingerprint) && wait.pause(ctx) {
				continue
			}
			s.answerRunning(w, k, row)
			return
		case err == nil && row != nil && row.run == nil && !row.expired:
			t.end(ctx)
			s.answerStored(w, k, row)
			return
		case stillInProgress(ctx, err) || err == nil && !got:
			t.end(ctx)
			s.answerInProgress(w, stillRunning, s.cfg.RetryAfter)
			return
		case err != nil:
			t.end(ctx)
			s.unavailable(w, r, "claim the key", err)
			return
		}
		break
	}
	defer t.end(ctx)
	conn := t.conn
	var err error
	// The run goes on without the client: a client that gives up does not
	// stop it half way, and its retry gets the response.
	base := context.WithoutCancel(ctx)
	token := newToken()
	var run *Run
	var step Step
	b := s.closing()
	if row != nil && row.run != nil {
		// Its server is gone (its lease ran out): this request takes the run
		// over and resumes it from its recovery point. The takeover waits
		// for the row's lock while a server past its lease is still in an
		// Atomic phase, for as long as that phase may run (a lease), or
		// until the client gives up; then the row as it is now answers.
		run = &Run{Scope: k.scope, Key: k.key}
		var took bool
		var waited time.Duration
		var now *stored
		b.Queue(`SELECT set_config('lock_timeout', $1, true)`, strconv.FormatInt(p.flow.Lease.Milliseconds(), 10))
		s.keys.queueTakeOver(b, p.flow.Name, k.scope, k.key, token, p.flow.Lease, byRetry, &took, &waited, run)
		s.keys.queueRead(b, k.scope, k.key, &now)
		queueCommit(b)
		sent := time.Now()
		err = conn.SendBatch(ctx, b).Close()
		t.committed = err == nil
		t.end(ctx)
		// The lease started when the takeover got the row's lock, after
		// its wait: the phase gets the whole of it.
		leaseStart := sent.Add(waited)
		switch {
		case stillInProgress(ctx, err) || err == nil && !took && now != nil && now.run != nil:
			if now == nil {
				now = row
			}
			s.answerRunning(w, k, now)
		case err != nil:
			s.unavailable(w, r, "take the run over", err)
		case !took && now != nil && !now.expired:
			s.answerStored(w, k, now) // completed meanwhile
		case !took:
			s.answerInProgress(w, "a request with this key was running: retry with the same key to get its response", s.cfg.RetryAfter)
		default:
			p.respond(w, r, p.advance(base, run, token, leaseStart))
		}
		return
	}
	run = &Run{Scope: k.scope, Key: k.key, Method: r.Method, Route: k.row.route, Body: k.body, Taken: 1, id: newToken()}
	err = s.guarded(t.tx, "flow's Start", func(tx pgx.Tx) (err error) {
		step, err = p.flow.Start(r, tx, run)
		return err
	})
	if err == nil {
		err = p.check(step)
	}
	if err != nil {
		t.end(ctx)
		s.log.Error("idempotency: a flow's Start failed; its transaction was rolled back and its key is free again",
			slog.String("flow", p.flow.Name), slog.String("error", err.Error()))
		requestFailed(w)
		return
	}
	if step.respond && !storable(step.status) {
		t.end(ctx)
		send(w, step.header, step.status, step.body)
		return
	}
	if row != nil {
		s.keys.queueForget(b, k.scope, k.key) // expired
	}
	if step.respond {
		k.row.status, k.row.headers, k.row.body = step.status, encodeHeaders(step.header, s.cfg.SecretHeaders), nonNil(step.body)
		s.keys.queueComplete(b, k.scope, k.key, &k.row, s.cfg.Retention)
	} else {
		s.keys.queueBeginRun(b, k, p.flow.Name, run, step, token, p.flow.Lease, s.cfg.Retention)
	}
	queueCommit(b)
	leaseStart := time.Now()
	err = conn.SendBatch(base, b).Close()
	t.committed = err == nil
	t.end(ctx)
	switch {
	case err != nil:
		s.commitFailed(w, r, "Start", err)
	case step.respond:
		send(w, step.header, step.status, step.body)
	default:
		run.Point, run.State = step.point, step.state
		p.respond(w, r, p.advance(base, run, token, leaseStart))
	}
}

// result is where a run's go ended, and with what.
type result struct {
	outcome   outcome
	step      Step          // the response, when completed or answered
	err       error         // why, when failed or unreachable
	leaseLeft time.Duration // of the server that took the run, when lost
}

// respond answers a request from the result of its run's go.
func (p *Phased) respond(w http.ResponseWriter, r *http.Request, res result) {
	switch res.outcome {
	case completed, answered:
		send(w, res.step.header, res.step.status, res.step.body)
	case failed:
		problem(w, aboutBlank, http.StatusInternalServerError, "Request failed part way",
			"the request failed after part of it was recorded: retry it with the same key, and it resumes where it stopped", 0)
	case lost:
		p.s.answerInProgress(w, "another server resumed this request: retry after a while with the same key to get its response", max(p.s.cfg.RetryAfter, res.leaseLeft))
	case unreachable:
		p.s.unavailable(w, r, "record a recovery point", res.err)
	}
}

// advance runs run's phases from its recovery point, as the holder of
// token, whose lease started at leaseStart, until a phase responds or
// fails, or the lease is lost.
func (p *Phased) advance(ctx context.Context, run *Run, token string, leaseStart time.Time) result {
	if run.giveUp == "" && run.Taken > p.flow.MaxTakes {
		run.giveUp = fmt.Sprintf("taken %d times, more than the flow's MaxTakes (%d)", run.Taken, p.flow.MaxTakes)
		if run.lastError != "" {
			run.giveUp += "; its last error: " + run.lastError
		}
	}
	for range maxPhases {
		ph, ok := p.phases[run.Point]
		if run.giveUp != "" {
			ph, ok = p.givingUp(), true
		}
		var res result
		var next Step
		if !ok {
			res = result{outcome: failed, err: fmt.Errorf("no phase of flow %q continues from recovery point %q", p.flow.Name, run.Point)}
		} else {
			// A phase ends with its lease: after that another server may
			// run it too.
			phaseCtx, cancel := context.WithDeadline(ctx, leaseStart.Add(p.flow.Lease))
			if ph.Atomic != nil {
				next, leaseStart, res = p.atomic(ctx, phaseCtx, ph, run, token)
			} else {
				next, leaseStart, res = p.external(ctx, phaseCtx, ph, run, token)
			}
			cancel()
		}
		if res.outcome == failed || res.outcome == answered {
			// The run stays at its recovery point, and its lease ends now,
			// so that the client's retry resumes it at once.
			why := fmt.Sprintf("answered %d, which is not stored", res.step.status)
			if res.outcome == failed {
				why = res.err.Error()
				p.s.log.Error("idempotency: a phase failed; the run stays at its recovery point, for a retry or the sweep to resume",
					slog.String("flow", p.flow.Name), slog.String("point", run.Point), slog.String("error", why))
			}
			rctx := context.WithoutCancel(ctx)
			err := withConn(rctx, p.s.db, func(c *pgxpool.Conn) error {
				return p.s.keys.release(rctx, c, run.Scope, run.Key, token, why, p.flow.sweepDelay(run.Taken))
			})
			if err != nil {
				p.s.log.Warn("idempotency: could not release a run's lease; it is resumed when the lease runs out",
					slog.String("flow", p.flow.Name), slog.String("error", err.Error()))
			}
			return res
		}
		if res.outcome != completed || next.respond {
			if res.outcome == completed && run.giveUp != "" {
				p.s.log.Warn("idempotency: a run was given up; its key is complete with the flow's give-up response",
					slog.String("flow", p.flow.Name), slog.String("point", run.Point), slog.Int("taken", run.Taken),
					slog.Int("status", next.status), slog.String("reason", run.giveUp))
			}
			return res
		}
		run.Point, run.State = next.point, next.state
	}
	return result{outcome: failed, err: fmt.Errorf("flow %q went through %d phases without responding", p.flow.Name, maxPhases)}
}

// atomic runs an Atomic phase in a transaction that first checks the lease
// (and locks the run's row) and then commits the phase's writes with its
// step. The result is completed when the step committed; next is the step
// and lease when the new lease started. The phase runs with phaseCtx,
// which ends with the lease; the bookkeeping with ctx, since the row's
// lock, not the clock, says the run is still this server's.
func (p *Phased) atomic(ctx, phaseCtx context.Context, ph Phase, run *Run, token string) (next Step, lease time.Time, res result) {
	s := p.s
	var holds bool
	var left time.Duration
	t, err := s.begin(ctx, func(b *pgx.Batch, _ string) opening {
		s.keys.queueHolds(b, run.Scope, run.Key, token, &holds, &left)
		return opening{}
	})
	if t != nil {
		defer t.end(ctx)
	}
	if err != nil {
		return next, lease, result{outcome: unreachable, err: err}
	}
	conn := t.conn
	if !holds {
		return next, lease, result{outcome: lost, leaseLeft: left}
	}
	err = s.guarded(t.tx, "phase", func(tx pgx.Tx) (err error) {
		next, err = ph.Atomic(phaseCtx, tx, run)
		return err
	})
	if err == nil {
		err = p.check(next)
	}
	switch {
	case err != nil:
		return next, lease, result{outcome: failed, err: err}
	case next.respond && !storable(next.status):
		return next, lease, result{outcome: answered, step: next}
	}
	b := s.closing()
	sql, args := s.keys.stepSQL(run.Scope, run.Key, token, next, s.cfg.SecretHeaders, p.flow.Lease, s.cfg.Retention)
	b.Queue(sql, args...)
	queueCommit(b)
	lease = time.Now()
	err = conn.SendBatch(ctx, b).Close()
	t.committed = err == nil
	switch {
	case handlersFault(err):
		return next, lease, result{outcome: failed, err: fmt.Errorf("the phase's transaction was refused at COMMIT: %w", err)}
	case err != nil:
		return next, lease, result{outcome: unreachable, err: err}
	}
	return next, lease, result{outcome: completed, step: next}
}

// external runs an External phase with phaseCtx, and then commits its
// step, with ctx, if token still holds the run: a phase that outran its
// lease may still record its step, if no one took the run over meanwhile.
func (p *Phased) external(ctx, phaseCtx context.Context, ph Phase, run *Run, token string) (next Step, lease time.Time, res result) {
	s := p.s
	err := func() (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("the phase panicked: %v", v)
			}
		}()
		next, err = ph.External(phaseCtx, run)
		return err
	}()
	if err == nil {
		err = p.check(next)
	}
	switch {
	case err != nil:
		return next, lease, result{outcome: failed, err: err}
	case next.respond && !storable(next.status):
		return next, lease, result{outcome: answered, step: next}
	}
	sql, args := s.keys.stepSQL(run.Scope, run.Key, token, next, s.cfg.SecretHeaders, p.flow.Lease, s.cfg.Retention)
	lease = time.Now()
	var tag pgconn.CommandTag
	err = withConn(ctx, s.db, func(c *pgxpool.Conn) (err error) {
		tag, err = c.Exec(ctx, sql, args...)
		return err
	})
	switch {
	case err != nil:
		return next, lease, result{outcome: unreachable, err: err}
	case tag.RowsAffected() == 0:
		res := result{outcome: lost}
		_ = withConn(ctx, s.db, func(c *pgxpool.Conn) (err error) { // for the Retry-After only
			res.leaseLeft, err = s.keys.leaseLeft(ctx, c, run.Scope, run.Key)
			return err
		})
		return next, lease, res
	}
	return next, lease, result{outcome: completed, step: next}
}

// Recover resumes, one after the other, up to limit runs of the flow whose
// lease ran out: those whose server died, or whose phase failed and whose
// client did not retry. It returns how many of them completed. Call it on
// a schedule (RunRecovery does), from one server or from all: two sweeps
// never resume the same run at once.
func (p *Phased) Recover(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("idempotency: Recover: limit must be positive (got %d)", limit)
	}
	var stalled [][2]string
	err := withConn(ctx, p.s.db, func(c *pgxpool.Conn) (err error) {
		stalled, err = p.s.keys.stalled(ctx, c, p.flow.Name, limit)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idempotency: list the stalled runs of flow %q: %w", p.flow.Name, err)
	}
	done := 0
	for _, sk := range stalled {
		if ctx.Err() != nil {
			return done, ctx.Err()
		}
		token := newToken()
		b := &pgx.Batch{}
		var took bool
		var waited time.Duration
		// The run as the takeover finds it, not as listed: it may have
		// moved on since. One whose server is in an Atomic phase is
		// skipped, not waited for.
		run := &Run{Scope: sk[0], Key: sk[1]}
		p.s.keys.queueTakeOver(b, p.flow.Name, run.Scope, run.Key, token, p.flow.Lease, bySweep, &took, &waited, run)
		sent := time.Now()
		err := withConn(ctx, p.s.db, func(c *pgxpool.Conn) error { return c.SendBatch(ctx, b).Close() })
		leaseStart := sent.Add(waited)
		if err != nil {
			return done, fmt.Errorf("idempotency: take a stalled run of flow %q over: %w", p.flow.Name, err)
		}
		if !took {
			continue // resumed meanwhile, by a retry or another sweep, or being run
		}
		if res := p.advance(ctx, run, token, leaseStart); res.outcome == completed {
			done++
		}
	}
	return done, nil
}

// withConn runs f on a connection borrowed from db.
func withConn(ctx context.Context, db DB, f func(c *pgxpool.Conn) error) error {
	c, err := db.Acquire(ctx)
	if err != nil {
		return err
	}
	defer c.Release()
	return f(c)
}

// RunRecovery calls Recover every interval, until ctx ends, and logs what
// it resumed and what failed. It returns ctx's error.
func (p *Phased) RunRecovery(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return fmt.Errorf("idempotency: RunRecovery: every must be positive (got %v)", every)
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		for {
			n, err := p.Recover(ctx, 100)
			if err != nil && ctx.Err() == nil {
				p.s.log.Warn("idempotency: the recovery sweep failed", slog.String("flow", p.flow.Name), slog.String("error", err.Error()))
			}
			if n > 0 {
				p.s.log.Info("idempotency: the recovery sweep completed runs", slog.String("flow", p.flow.Name), slog.Int("completed", n))
			}
			if n < 100 || err != nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
