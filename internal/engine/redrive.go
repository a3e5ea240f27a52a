package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/claims"
	"github.com/kafkaonce/kafkaonce/internal/usercall"
)

// Redrive runs the pending dead letters of this consumer that f selects
// through its handler again (see consumer.Consumer.Redrive).
func (c *Consumer) Redrive(ctx context.Context, f deadletter.Filter) (kafkaoncetype.RedriveResult, error) {
	var letters []deadletter.Letter
	err := c.readOnly(ctx, func(q querier) (err error) {
		f.Consumer, f.Pending = c.cfg.Name, true
		letters, err = c.letters.List(ctx, q, f)
		return err
	})
	if err != nil {
		return kafkaoncetype.RedriveResult{}, fmt.Errorf("consumer: redrive: %w", err)
	}
	var res kafkaoncetype.RedriveResult
	for _, l := range letters {
		if f.RetryDue && c.pausedFor(l.Topic, l.Partition) {
			// A pause is what an operator puts on for the outage the
			// retries are waiting out: they wait for the resume too.
			continue
		}
		applied, err := c.redriveOne(ctx, l.ID, f.RetryDue)
		switch {
		case errors.Is(err, errNotDue):
			// Retried by another member meanwhile, and due later (or out
			// of retries): nothing to do now.
			continue
		case ctx.Err() != nil:
			return res, ctx.Err()
		case err != nil:
			res.Failed = append(res.Failed, kafkaoncetype.RedriveError{LetterID: l.ID, Err: err})
			retry := l.Class == deadletter.ClassRetryLater && l.RetryAt != nil
			var rec *retryRecord
			if retry && errors.As(err, &rec) {
				// A retry whose handler failed, as expected of some: its
				// record, committed, says when the next is due, or that
				// they ran out.
				c.log.Debug("retry later failed", slog.Int64("dead_letter", l.ID), slog.String("message_id", l.MessageID), slog.String("error", err.Error()))
				if rec.recorded {
					c.reportRetryFailed(ctx, rec.letter, rec.next, rec.final, rec.cause)
				}
			} else {
				c.log.Warn("redrive failed; the letter stays", slog.Int64("dead_letter", l.ID), slog.String("error", err.Error()))
			}
			if retry && !errors.Is(err, errRetryRecorded) {
				c.retryFailed(ctx, &l, err)
			}
			if l.RedriveRequestedAt != nil {
				// The failure answers the request read above; a request
				// made since waits for an attempt of its own.
				if merr := c.inTx(ctx, func(q querier) error {
					_, err := c.letters.MarkRedriveFailed(ctx, q, l.ID, *l.RedriveRequestedAt, err.Error())
					return err
				}); merr != nil {
					c.log.Warn("could not record a failed redrive", slog.Int64("dead_letter", l.ID), slog.String("error", merr.Error()))
				}
			}
		case applied:
			res.Applied++
		default:
			res.AlreadyApplied++
		}
	}
	return res, nil
}

// retryOutcome is what a failed retry of a letter set aside for later
// leads to: the next retry_at (nil: none, the letter becomes an ordinary
// dead letter of class final), or count false for a failure of the
// database, which counts nothing (the next poll tries again).
//
// A network error is the database's when it is not the handler's (the
// retry's own statements and its COMMIT), or when the handler's
// transaction lost its connection (errConnLost), as classifyHandlerError
// has it for a worker's batch.
func (c *deps) retryOutcome(l *deadletter.Letter, cause error, now time.Time) (next *time.Time, final deadletter.Class, count bool) {
	var conflict *kafkaoncetype.FingerprintConflictError
	connLost := errors.Is(cause, errConnLost) || !errors.Is(cause, errHandlerFailed)
	f := classifyHandlerError(cause, connLost)
	switch {
	case errors.As(cause, &conflict):
		return nil, deadletter.ClassConflict, true
	case f.class == classInfra:
		return nil, "", false
	case f.class == classPermanent:
		return nil, f.kind, true // failed for good: no retry helps
	}
	return c.cfg.nextRetry(l, l.Retries+1, cause, now), deadletter.ClassRetriesExhausted, true
}

// retryFailed records a failed retry that its own transaction could not
// (the failure was its COMMIT's, or came before the handler ran), in a
// transaction of its own, unless another retry recorded one since l was
// read.
func (c *Consumer) retryFailed(ctx context.Context, l *deadletter.Letter, cause error) {
	next, final, count := c.retryOutcome(l, cause, time.Now())
	if !count {
		return
	}
	var recorded bool
	err := c.inTx(ctx, func(q querier) (err error) {
		recorded, err = c.letters.RetryFailed(ctx, q, l.ID, l.Retries, next, final, cause.Error())
		return err
	})
	if err != nil {
		c.log.Warn("could not record a failed retry; it is tried again at the next poll", slog.Int64("dead_letter", l.ID), slog.String("error", err.Error()))
		return
	}
	if recorded { // else settled, redriven or retried by another member since
		c.reportRetryFailed(ctx, l, next, final, cause)
	}
}

// reportRetryFailed reports a failed retry whose record committed: the
// next is due at next, or, with next nil, the message is an ordinary dead
// letter of class final from now on, waiting for an operator, which the
// dead-letter hooks report as they report a message set aside by a batch
// (so that metrics of dead letters count it).
func (c *deps) reportRetryFailed(ctx context.Context, l *deadletter.Letter, next *time.Time, final deadletter.Class, cause error) {
	if next == nil {
		c.log.Warn("a message set aside for later is an ordinary dead letter now: its retries ran out, or it failed for good",
			slog.Int64("dead_letter", l.ID), slog.String("message_id", l.MessageID), slog.Int("retries", l.Retries+1), slog.String("class", string(final)))
		m := messageOfLetter(l)
		m.ID = l.MessageID
		for _, h := range c.hooks.Dead {
			h(ctx, m, kafkaoncetype.DeadLettered{Class: final, Err: cause, Attempts: l.Attempts + l.Retries + 1})
		}
		return
	}
	c.log.Info("retry of a message set aside for later failed; tried again later", slog.Int64("dead_letter", l.ID),
		slog.String("message_id", l.MessageID), slog.Int("retries", l.Retries+1), slog.Time("retry_at", *next))
}

// errRetryRecorded wraps the handler's error of a retry whose failure was
// recorded in its own transaction, under the letter's lock.
var errRetryRecorded = errors.New("retry failed")

// retryRecord is a failed retry recorded in its own transaction: reported
// (reportRetryFailed) once that transaction committed, if recorded (else
// another member retried, or an operator settled, the letter since).
type retryRecord struct {
	letter   *deadletter.Letter
	next     *time.Time
	final    deadletter.Class
	cause    error
	recorded bool
}

func (r *retryRecord) Error() string   { return errRetryRecorded.Error() + ": " + r.cause.Error() }
func (r *retryRecord) Unwrap() []error { return []error{errRetryRecorded, r.cause} }

// errNotDue ends a retry whose letter, once locked, is not due any more:
// another member retried it meanwhile.
var errNotDue = errors.New("not due")

// errHandlerFailed wraps the handler's error in a redrive's: its message
// failed, not the database.
var errHandlerFailed = errors.New("handler")

// errConnLost wraps a handler's error in a redrive whose transaction had
// lost its connection by then: a network error in it is the database's.
var errConnLost = errors.New("the connection to Postgres was lost")

// errAlreadyApplied ends a redrive transaction that found nothing to do.
var errAlreadyApplied = errors.New("already applied")

// redriveOne redrives one letter; applied is false when it turned out to be
// applied already. Its transaction runs as an attempt under the handler
// watchdog, as a worker's batch does: a handler that hangs is abandoned
// after HandlerTimeout (or, once ctx ends, after a short grace), so neither
// Redrive nor the consumer's shutdown waits on it.
//
// A letter set aside for later (class retry_later) is retried with its
// failure recorded in the same transaction, under the letter's lock: the
// handler's writes and the claim are rolled back to a savepoint, and the
// count and the next retry_at committed, so that another member, which
// waits for the lock, finds the letter due later and leaves it. With due,
// a letter found not due once locked is left (errNotDue).
func (c *Consumer) redriveOne(ctx context.Context, letterID int64, due bool) (applied bool, err error) {
	var msg *kafkaoncetype.Message
	err, abandoned := usercall.Run(ctx, c.user.limits, func(hctx, ctx context.Context, uc *usercall.Attempt) error {
		bt, err := c.beginWith(ctx, &pgx.Batch{})
		if err != nil {
			return err
		}
		defer bt.rollback(ctx)
		uc.Hold(bt.cutLoose)
		tx := bt.tx
		err = func() error {
			l, err := c.letters.GetForUpdate(ctx, tx, c.cfg.Name, letterID)
			if err != nil {
				return err
			}
			if l.RedrivenAt != nil || l.SettledAt != nil {
				// Redriven, or settled by an operator, since it was
				// listed: there is nothing left to do.
				return errAlreadyApplied
			}
			later := l.Class == deadletter.ClassRetryLater && l.RetryAt != nil
			if due && (!later || l.RetryAt.After(time.Now())) {
				return errNotDue
			}
			if later {
				if _, err := tx.Exec(ctx, "SAVEPOINT kafkaonce_retry"); err != nil {
					return err
				}
			}
			m := messageOfLetter(&l)
			id := l.MessageID
			if id == "" {
				if id, err = c.user.id(m); err != nil {
					return err
				}
			}
			m.ID = id
			claim := claims.Claim{MessageID: id, Fingerprint: dedupe.FingerprintOf(m.Key, m.Value), Offset: l.Offset}
			ok, existing, err := c.claims.Reclaim(ctx, tx, c.cfg.Name, l.Topic, l.Partition, claim)
			if err != nil {
				return err
			}
			if !ok {
				if existing.Fingerprint != claim.Fingerprint {
					return &kafkaoncetype.FingerprintConflictError{Topic: l.Topic, Partition: l.Partition, Offset: l.Offset, MessageID: id,
						Fingerprint: claim.Fingerprint, Existing: existing}
				}
				// The id was applied meanwhile (a later copy of the
				// message): the letter is settled.
				if err := c.letters.MarkRedriven(ctx, tx, l.ID); err != nil {
					return err
				}
				return errAlreadySettled
			}
			// The letter keeps the message's headers, trace context
			// included: a tracing hook's span continues the message's trace.
			cctx, endCall := c.hooks.enterHandler(hctx, m)
			err = c.user.call(cctx, uc, 0, tx, m)
			endCall(err)
			if err == nil {
				// The handler is done: the server checks the session it
				// left before anything of the consumer's is written.
				err = c.afterUserCode(ctx, tx)
			}
			if err != nil {
				err = fmt.Errorf("%w: %w", errHandlerFailed, err)
				if tx.Conn().IsClosed() {
					err = fmt.Errorf("%w: %w", errConnLost, err)
				}
				if later {
					return c.recordRetryFailed(ctx, tx, &l, err)
				}
				return err
			}
			msg = m
			return c.letters.MarkRedriven(ctx, tx, l.ID)
		}()
		if errors.Is(err, errRetryRecorded) {
			if cerr := bt.commitWith(ctx, &pgx.Batch{}); cerr != nil {
				// Not recorded after all: the database failed, and the
				// next poll tries again.
				return fmt.Errorf("recording the failed retry: %w (the retry: %v)", cerr, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		return bt.commitWith(ctx, &pgx.Batch{})
	})
	if abandoned != nil {
		return false, fmt.Errorf("%w: %w", errHandlerFailed, abandoned.Err())
	}
	switch {
	case errors.Is(err, errAlreadyApplied):
		return false, nil
	case errors.Is(err, errAlreadySettled):
		return false, c.markSettled(ctx, letterID)
	case err != nil:
		return false, err
	}
	for _, h := range c.hooks.Applied {
		h(ctx, msg)
	}
	c.log.Info("dead letter redriven", slog.Int64("dead_letter", letterID), slog.String("topic", msg.Topic),
		slog.Int("partition", msg.Partition), slog.Int64("offset", msg.Offset), slog.String("message_id", msg.ID))
	return true, nil
}

// recordRetryFailed rolls the retry's transaction back to before its claim
// and its handler, and records the failure there, so that its COMMIT
// commits the count and the next retry_at; the *retryRecord it returns is
// reported once the COMMIT succeeded. A failure of the database, or a
// transaction that cannot be rolled back to the savepoint, is returned as
// it is: nothing is counted.
func (c *Consumer) recordRetryFailed(ctx context.Context, tx pgx.Tx, l *deadletter.Letter, cause error) error {
	next, final, count := c.retryOutcome(l, cause, time.Now())
	if !count {
		return cause
	}
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT kafkaonce_retry"); err != nil {
		return errors.Join(cause, err)
	}
	recorded, err := c.letters.RetryFailed(ctx, tx, l.ID, l.Retries, next, final, cause.Error())
	if err != nil {
		return errors.Join(cause, err)
	}
	return &retryRecord{letter: l, next: next, final: final, cause: cause, recorded: recorded}
}

// afterUserCode has the server check the session a handler left in tx
// (see schema.AfterUserCode): an error wrapping ErrSessionChanged when
// the handler changed what the consumer's statements rely on.
func (c *Consumer) afterUserCode(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, schema.AfterUserCode(c.cfg.Schema))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == schema.SessionChanged {
		return fmt.Errorf("%w (%w)", kafkaoncetype.ErrSessionChanged, err)
	}
	return err
}

// errAlreadySettled rolls back a redrive whose id turned out to be applied;
// markSettled then records that in a transaction of its own.
var errAlreadySettled = errors.New("settled by a later copy")

func (c *Consumer) markSettled(ctx context.Context, letterID int64) error {
	return c.inTx(ctx, func(q querier) error { return c.letters.MarkRedriven(ctx, q, letterID) })
}

func messageOfLetter(l *deadletter.Letter) *kafkaoncetype.Message {
	m := &kafkaoncetype.Message{Topic: l.Topic, Partition: l.Partition, Offset: l.Offset, Key: l.Key, Value: l.Value, Time: l.MessageTime}
	for _, h := range l.Headers {
		m.Headers = append(m.Headers, kafkaoncetype.Header{Key: h.Key, Value: h.Value})
	}
	return m
}
