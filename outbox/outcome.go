package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/permanent"
)

// outcome of one row.
type outcome struct {
	err     error
	wait    time.Duration // for a retry
	park    bool
	deferTo time.Duration // over the retry budget: try again later, no attempt used
	// held means not attempted, because an earlier row of its key failed in this
	// round. Nothing is recorded: the failed row, waiting, holds it back.
	held bool
}

// delivered reports whether the row reached its receiver.
func (o *outcome) delivered() bool { return o.err == nil && o.deferTo == 0 && !o.held }

// spendBudget defers the retries over the retry budget, without using an
// attempt; a deferred row holds the later rows of its key.
func (r *Relay) spendBudget(rows []row, outcomes []outcome) {
	blocked := map[string]bool{}
	for i := range rows {
		k := string(rows[i].key)
		switch {
		case blocked[k]:
			outcomes[i] = outcome{held: true}
		case rows[i].attempts > 0 && !r.budget.allowRetry():
			outcomes[i] = outcome{deferTo: r.cfg.RetryInitialInterval}
			blocked[k] = true
		}
	}
}

// pending reports whether the row is still to be attempted this round.
func (o *outcome) pending() bool { return o.deferTo == 0 && !o.held }

// judge turns a delivery's error into what to record.
func (r *Relay) judge(rw *row, err error) outcome {
	if err == nil {
		r.budget.success()
		return outcome{}
	}
	attempt := rw.attempts + 1
	if permanent.Is(err) || attempt >= r.cfg.MaxAttempts {
		return outcome{err: err, park: true}
	}
	wait := r.backoff.Wait(attempt)
	var ra *retryAfterError
	if errors.As(err, &ra) {
		wait = max(wait, ra.after)
	}
	return outcome{err: err, wait: wait}
}

// record deletes delivered rows and schedules or parks the others, in the
// round's transaction, and returns the database's clock then: what a
// delivery's latency is measured to, by the clock of the rows' created_at.
func (r *Relay) record(ctx context.Context, tx pgx.Tx, rows []row, outcomes []outcome) (time.Time, error) {
	var done, retrySeqs, parkSeqs []int64
	var waits []float64
	var retryErrs, parkErrs []string
	var deferSeqs []int64
	var deferWaits []float64
	for i := range rows {
		o := outcomes[i]
		switch {
		case o.held:
		case o.deferTo > 0:
			deferSeqs = append(deferSeqs, rows[i].seq)
			deferWaits = append(deferWaits, o.deferTo.Seconds())
		case o.err == nil:
			done = append(done, rows[i].seq)
		case o.park:
			parkSeqs = append(parkSeqs, rows[i].seq)
			parkErrs = append(parkErrs, o.err.Error())
			r.log.Error("outbox row parked: it will not be retried until an operator retries it", slog.String("id", rows[i].id),
				slog.String("destination", rows[i].dest), slog.Int("attempts", rows[i].attempts+1), slog.String("error", o.err.Error()))
		default:
			retrySeqs = append(retrySeqs, rows[i].seq)
			waits = append(waits, o.wait.Seconds())
			retryErrs = append(retryErrs, o.err.Error())
		}
	}
	// The clock goes first, in the same round trip.
	b := &pgx.Batch{}
	b.Queue(`SELECT clock_timestamp()`)
	if len(done) > 0 {
		b.Queue(`DELETE FROM `+r.table+` WHERE seq = ANY($1)`, done)
	}
	if len(retrySeqs) > 0 {
		b.Queue(`UPDATE `+r.table+` o SET attempts = o.attempts + 1, last_error = u.err,
	next_attempt_at = now() + make_interval(secs => u.wait)
FROM unnest($1::bigint[], $2::float8[], $3::text[]) AS u(seq, wait, err) WHERE o.seq = u.seq`, retrySeqs, waits, retryErrs)
	}
	if len(parkSeqs) > 0 {
		b.Queue(`UPDATE `+r.table+` o SET attempts = o.attempts + 1, last_error = u.err, failed_at = now()
FROM unnest($1::bigint[], $2::text[]) AS u(seq, err) WHERE o.seq = u.seq`, parkSeqs, parkErrs)
	}
	if len(deferSeqs) > 0 {
		b.Queue(`UPDATE `+r.table+` o SET next_attempt_at = greatest(o.next_attempt_at, now() + make_interval(secs => u.wait))
FROM unnest($1::bigint[], $2::float8[]) AS u(seq, wait) WHERE o.seq = u.seq`, deferSeqs, deferWaits)
	}
	br := tx.SendBatch(ctx, b)
	var now time.Time
	err := br.QueryRow().Scan(&now)
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("outbox: record results: %w", err)
	}
	return now, nil
}
