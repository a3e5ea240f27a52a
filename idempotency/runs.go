package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
)

// The statements of a phased request's run, on its key's row. Every one
// that changes a run in progress names the lease's token, so a server
// whose lease ran out (and was taken over) changes nothing.

// newToken makes a lease's token: who holds a run.
func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// interval is d as a Postgres interval literal.
func interval(d time.Duration) string {
	return strconv.FormatInt(d.Microseconds(), 10) + " microseconds"
}

// queueBeginRun adds to b the key's row for run, which starts: in
// progress, at point, held by token for lease.
func (k keys) queueBeginRun(b *pgx.Batch, req *keyed, flow string, run *Run, s Step, token string, lease, retention time.Duration) {
	b.Queue(`INSERT INTO `+k.table+` (scope, idem_key, method, route, fingerprint, flow, run_id, recovery_point, state,
			lease_token, lease_until, taken, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, clock_timestamp() + $11::interval, 1, clock_timestamp() + $12::interval)`,
		req.scope, req.key, req.row.method, req.row.route, req.row.fingerprint, flow, run.id, s.point, s.state,
		token, interval(lease), interval(retention))
}

// taker is who takes a run over, which decides how the takeover treats a
// locked row and the sweep's backoff.
type taker int

const (
	// byRetry, a client's retry: it waits for a locked row (its server is
	// in an Atomic phase), and does not wait for the sweep's backoff.
	byRetry taker = iota
	// bySweep, the recovery sweep: it skips a locked row, and a run within
	// its backoff.
	bySweep
	// byOperator, Phased.GiveUp: it skips a locked row only.
	byOperator
)

// queueTakeOver adds to b the takeover of the key's run if its lease ran
// out: token holds it for lease from then on. The run's recovery point and
// state are read into run by the same statement, as the takeover finds
// them: a server that recorded a step, or renewed its lease, just before
// is never resumed from what it left behind. *took says whether the run
// was taken; it is not when its lease is live. *waited is how long the
// statement ran before the new lease started (its wait for the row's
// lock): the lease started that long after the statement was sent, or
// later.
func (k keys) queueTakeOver(b *pgx.Batch, flow, scope, key, token string, lease time.Duration, by taker, took *bool, waited *time.Duration, run *Run) {
	cond, lock := "", "FOR UPDATE"
	if by != byRetry {
		lock += " SKIP LOCKED"
	}
	if by == bySweep {
		cond = "AND (sweep_after IS NULL OR sweep_after <= clock_timestamp())"
	}
	b.Queue(`UPDATE `+k.table+` SET lease_token = $3, lease_until = clock_timestamp() + $4::interval, taken = taken + 1
		WHERE (scope, idem_key) = (SELECT scope, idem_key FROM `+k.table+`
			WHERE scope = $1 AND idem_key = $2 AND flow = $5 AND status IS NULL AND lease_until <= clock_timestamp() `+cond+` `+lock+`)
		RETURNING method, route, run_id, recovery_point, state, taken, coalesce(last_error, ''),
			extract(epoch FROM clock_timestamp() - statement_timestamp())::float8`,
		scope, key, token, interval(lease), flow).
		QueryRow(func(r pgx.Row) error {
			var w float64
			err := r.Scan(&run.Method, &run.Route, &run.id, &run.Point, &run.State, &run.Taken, &run.lastError, &w)
			*took = err == nil
			*waited = max(0, seconds(w))
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
}

// queueHolds adds to b a check that token still holds the run, which
// locks its row until the transaction ends: no takeover meanwhile. When it
// does not, *leaseLeft is what is left of the lease of whoever does.
func (k keys) queueHolds(b *pgx.Batch, scope, key, token string, holds *bool, leaseLeft *time.Duration) {
	b.Queue(`SELECT lease_token = $3, extract(epoch FROM lease_until - clock_timestamp())::float8
		FROM `+k.table+` WHERE scope = $1 AND idem_key = $2 AND status IS NULL FOR UPDATE`,
		scope, key, token).
		QueryRow(func(r pgx.Row) error {
			var left float64
			err := r.Scan(holds, &left)
			if errors.Is(err, pgx.ErrNoRows) {
				*holds = false
				return nil
			}
			*leaseLeft = seconds(left)
			return err
		})
}

// leaseLeft is what is left of the lease on the key's run in progress: 0
// when there is none, or it ran out.
func (k keys) leaseLeft(ctx context.Context, q Querier, scope, key string) (time.Duration, error) {
	var left *float64
	err := q.QueryRow(ctx, `SELECT extract(epoch FROM lease_until - clock_timestamp())::float8
		FROM `+k.table+` WHERE scope = $1 AND idem_key = $2`, scope, key).Scan(&left)
	if errors.Is(err, pgx.ErrNoRows) || left == nil {
		return 0, nil
	}
	return max(0, seconds(*left)), err
}

// seconds converts a count of seconds from Postgres.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// stepSQL is the statement that commits a phase's step on the run held by
// token: the next recovery point and a new lease, or the response that
// completes the key.
func (k keys) stepSQL(scope, key, token string, s Step, secret []string, lease, retention time.Duration) (string, []any) {
	if s.respond {
		return `UPDATE ` + k.table + ` SET status = $4, headers = $5, body = $6, expires_at = clock_timestamp() + $7::interval,
				recovery_point = NULL, state = NULL, lease_token = NULL, lease_until = NULL, sweep_after = NULL,
				given_up_at = CASE WHEN $8::text IS NULL THEN NULL ELSE clock_timestamp() END, give_up_reason = $8
			WHERE scope = $1 AND idem_key = $2 AND status IS NULL AND lease_token = $3`,
			[]any{scope, key, token, s.status, encodeHeaders(s.header, secret), nonNil(s.body), interval(retention), s.givenUp}
	}
	return `UPDATE ` + k.table + ` SET recovery_point = $4, state = $5, lease_until = clock_timestamp() + $6::interval, sweep_after = NULL
		WHERE scope = $1 AND idem_key = $2 AND status IS NULL AND lease_token = $3`,
		[]any{scope, key, token, s.point, s.state, interval(lease)}
}

// maxLastError bounds the stored reason of a phase's failure.
const maxLastError = 4 << 10

// release gives a run held by token up after a phase failed, with why: its
// lease ends now, so the client's retry resumes it at once. why quotes
// whatever the phase's error said (a provider's answer in any encoding):
// it is made storable, so that the lease ends whatever the text.
//
// The sweep leaves the run alone for sweepAfter.
func (k keys) release(ctx context.Context, q Querier, scope, key, token, why string, sweepAfter time.Duration) error {
	_, err := q.Exec(ctx, `UPDATE `+k.table+` SET lease_until = clock_timestamp(), last_error = $4, last_error_at = clock_timestamp(),
			sweep_after = clock_timestamp() + $5::interval
		WHERE scope = $1 AND idem_key = $2 AND status IS NULL AND lease_token = $3`, scope, key, token, pgtext.Cut(why, maxLastError), interval(sweepAfter))
	return err
}

// stalled lists up to limit keys (scope, key) of flow's runs whose lease
// ran out.
func (k keys) stalled(ctx context.Context, q Querier, flow string, limit int) ([][2]string, error) {
	rows, err := q.Query(ctx, `SELECT scope, idem_key FROM `+k.table+`
		WHERE flow = $1 AND status IS NULL AND lease_until <= clock_timestamp()
			AND (sweep_after IS NULL OR sweep_after <= clock_timestamp())
		ORDER BY lease_until LIMIT $2`, flow, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2]string, error) {
		var sk [2]string
		err := r.Scan(&sk[0], &sk[1])
		return sk, err
	})
}

// nonNil is b, or an empty slice for nil: the columns are NOT NULL where it
// is used.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
