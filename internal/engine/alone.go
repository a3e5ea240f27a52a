package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/attempts"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// runAlone processes one message in transactions of its own until it is
// applied (or skipped), set aside, or the partition must stop. Before each
// attempt it records the attempt in Postgres and commits, so attempts that
// end with the process dying are counted too: a message that crashes the
// process every time is set aside after MaxAttempts, across restarts.
//
// prior is the failure that sent the message here (nil in careful mode,
// where the message has not failed yet in this process).
func (w *worker) runAlone(stop, work context.Context, one []item, prior *failure) error {
	it := &one[0]
	if it.idErr != nil {
		return w.setAside(stop, work, one, invalidIDFailure(it.idErr))
	}
	if prior != nil && w.cfg.Retry.MaxAttempts <= 1 {
		return w.setAside(stop, work, one, exhausted(prior))
	}
	key := attempts.Key{Consumer: w.cfg.Name, Topic: w.topic, Partition: w.partition, Offset: it.msg.Offset}
	l := w.newLadder()
	last := prior
	count := true
	var rec attempts.Record
	if prior != nil {
		// The failed batch was an attempt of the message: it is recorded,
		// with how it failed, before the wait for the next one, so that a
		// wait cut short (a pause, a revocation) loses no count, and a
		// message whose every retry is cut short still runs out of them.
		var err error
		if rec, err = w.recordAttempt(stop, work, key, it.msg.ID, 1); err != nil {
			return err
		}
		if err := w.attempts.Fail(work, w.db, key, string(prior.kind), prior.err.Error()); err != nil {
			w.log.Warn("could not record the failure of an attempt", w.logAttrs(slog.Int64("offset", it.msg.Offset), slog.String("error", err.Error()))...)
		}
		if (rec.Attempts >= w.cfg.Retry.MaxAttempts || w.elapsedOut(rec)) && !w.breaker.holding(w.topic) {
			f := exhausted(prior)
			f.attempts, f.first = rec.Attempts, rec.FirstAttemptAt
			return w.setAside(stop, work, one, f)
		}
	}
	for {
		if count {
			if last != nil {
				if err := l.retryAfterFailure(stop); err != nil {
					return err
				}
			}
			var err error
			if rec, err = w.recordAttempt(stop, work, key, it.msg.ID, 1); err != nil {
				return err
			}
			if w.exhausted(rec) && !w.breaker.holding(w.topic) {
				return w.setAside(stop, work, one, exhaustedFrom(rec, last, w.cfg.Retry.MaxAttempts))
			}
		}
		p := w.newPlan(one)
		out, err := l.step(work, one, &p, rec.Attempts)
		switch {
		case err != nil:
			return err
		case out.kind == succeeded:
			return nil
		case out.kind != messageFailed:
			// The database failed, not the message: try again without
			// counting an attempt.
			count = false
			if err := l.again(stop, it.msg.Offset, "transaction", &out); err != nil {
				return err
			}
			continue
		}
		f := out.fail
		f.attempts, f.first = rec.Attempts, rec.FirstAttemptAt
		w.reportFailure(work, &it.msg, f)
		if f.class == classPermanent {
			return w.setAside(stop, work, one, f)
		}
		if err := w.attempts.Fail(work, w.db, key, string(f.kind), f.err.Error()); err != nil {
			w.log.Warn("could not record the failure of an attempt", w.logAttrs(slog.Int64("offset", it.msg.Offset), slog.String("error", err.Error()))...)
		}
		last, count = f, true
		if (rec.Attempts >= w.cfg.Retry.MaxAttempts || w.elapsedOut(rec)) && !w.breaker.holding(w.topic) {
			return w.setAside(stop, work, one, exhausted(f))
		}
	}
}

// recordAttempt records the start of an attempt, retrying database
// failures until stop.
func (w *worker) recordAttempt(stop, work context.Context, key attempts.Key, id string, initial int) (rec attempts.Record, err error) {
	err = w.retryUntil(stop, "could not record an attempt at offset "+strconv.FormatInt(key.Offset, 10), func() (err error) {
		rec, err = w.attempts.Begin(work, w.db, key, id, initial)
		return err
	})
	if err == nil {
		w.attemptsUpTo = max(w.attemptsUpTo, key.Offset)
	}
	return rec, err
}

// exhausted reports whether the attempt just recorded is one too many.
func (w *worker) exhausted(rec attempts.Record) bool {
	return rec.Attempts > w.cfg.Retry.MaxAttempts || rec.Attempts > 1 && w.elapsedOut(rec)
}

func (w *worker) elapsedOut(rec attempts.Record) bool {
	return w.cfg.Retry.MaxElapsed > 0 && time.Since(rec.FirstAttemptAt) > w.cfg.Retry.MaxElapsed
}

// exhausted turns the last failure of a message that ran out of attempts
// into the failure it is set aside with.
func exhausted(last *failure) *failure {
	f := *last
	f.class = classPermanent
	if f.kind == "" {
		f.kind = deadletter.ClassRetriesExhausted
	}
	f.last = time.Now()
	return &f
}

// exhaustedFrom builds the failure of a message found out of attempts when
// an attempt was about to start: from the last failure seen in this
// process, else from what the attempt rows say. Attempts that left no error
// behind ended with the process (or its connection) dying.
func exhaustedFrom(rec attempts.Record, last *failure, maxAttempts int) *failure {
	made := rec.Attempts - 1
	if last != nil {
		f := exhausted(last)
		f.attempts, f.first = made, rec.FirstAttemptAt
		return f
	}
	f := newFailure(classPermanent, deadletter.ClassRetriesExhausted, errors.New(rec.LastError))
	if !rec.PreviousErrored {
		f.kind = deadletter.ClassCrashed
		f.err = fmt.Errorf("%d attempts (MaxAttempts %d) ended without a result: the process, or its connection to Postgres, died while the handler ran", made, maxAttempts)
		if rec.LastError != "" {
			f.err = fmt.Errorf("%w; an earlier attempt failed with: %s", f.err, rec.LastError)
		}
	}
	f.attempts, f.first = made, rec.FirstAttemptAt
	return f
}

// setAside dead-letters one message in a transaction of its own (or stops
// the partition under StopPartition).
func (w *worker) setAside(stop, work context.Context, one []item, f *failure) error {
	if w.cfg.OnPermanentFailure == kafkaoncetype.StopPartition {
		return &kafkaoncetype.PartitionError{Topic: w.topic, Partition: w.partition, Err: f.err}
	}
	l := w.newLadder()
	for {
		p := w.newPlan(one)
		p.deadLetter = map[int]*failure{0: f}
		out, err := l.step(work, one, &p, f.attempts)
		switch {
		case err != nil:
			return err
		case out.kind == succeeded:
			return nil
		}
		if err := l.again(stop, one[0].msg.Offset, "writing a dead letter", &out); err != nil {
			return err
		}
	}
}
