package idempotency

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// queueBeginRun adds to b the key's row for a run that starts: in
// progress, at point, held by token for lease.
func (k keys) queueBeginRun(b *pgx.Batch, req *keyed, flow string, s Step, token string, lease, retention time.Duration) {
	b.Queue(`INSERT INTO `+k.table+` (scope, idem_key, method, route, fingerprint, flow, recovery_point, state,
			lease_token, lease_until, taken, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, clock_timestamp() + $10::interval, 1, clock_timestamp() + $11::interval)`,
		req.scope, req.key, req.row.method, req.row.route, req.row.fingerprint, flow, s.point, s.state,
		token, interval(lease), interval(retention))
}

// queueTakeOver adds to b the takeover of a run whose lease ran out: from
// the token that held it to token, for lease. It changes no row when
// another server took it first, or renewed its lease meanwhile.
func (k keys) queueTakeOver(b *pgx.Batch, scope, key, from, token string, lease time.Duration, took *bool) {
	b.Queue(`UPDATE `+k.table+` SET lease_token = $4, lease_until = clock_timestamp() + $5::interval, taken = taken + 1
		WHERE scope = $1 AND idem_key = $2 AND status IS NULL AND lease_token = $3 AND lease_until <= clock_timestamp()`,
		scope, key, from, token, interval(lease)).
		Exec(func(tag pgconn.CommandTag) error { *took = tag.RowsAffected() == 1; return nil })
}

// queueHolds adds to b a check that token still holds the run, which
// locks its row until the transaction ends: no takeover meanwhile.
func (k keys) queueHolds(b *pgx.Batch, scope, key, token string, holds *bool) {
	b.Queue(`SELECT lease_token = $3 FROM `+k.table+` WHERE scope = $1 AND idem_key = $2 AND status IS NULL FOR UPDATE`,
		scope, key, token).
		QueryRow(func(r pgx.Row) error {
			err := r.Scan(holds)
			if err == pgx.ErrNoRows {
				*holds = false
				return nil
			}
			return err
		})
}

// stepSQL is the statement that commits a phase's step on the run held by
// token: the next recovery point and a new lease, or the response that
// completes the key.
func (k keys) stepSQL(scope, key, token string, s Step, secret []string, lease, retention time.Duration) (string, []any) {
	if s.respond {
		return `UPDATE ` + k.table + ` SET status = $4, headers = $5, body = $6, expires_at = clock_timestamp() + $7::interval,
				recovery_point = NULL, state = NULL, lease_token = NULL, lease_until = NULL, last_error = NULL
			WHERE scope = $1 AND idem_key = $2 AND status IS NULL AND lease_token = $3`,
			[]any{scope, key, token, s.status, encodeHeaders(s.header, secret), nonNil(s.body), interval(retention)}
	}
	return `UPDATE ` + k.table + ` SET recovery_point = $4, state = $5, lease_until = clock_timestamp() + $6::interval, last_error = NULL
		WHERE scope = $1 AND idem_key = $2 AND status IS NULL AND lease_token = $3`,
		[]any{scope, key, token, s.point, s.state, interval(lease)}
}

// release gives a run held by token up after a phase failed, with why: its
// lease ends now, so the client's retry resumes it at once.
func (k keys) release(ctx context.Context, q Querier, scope, key, token, why string) error {
	_, err := q.Exec(ctx, `UPDATE `+k.table+` SET lease_until = clock_timestamp(), last_error = $4
		WHERE scope = $1 AND idem_key = $2 AND status IS NULL AND lease_token = $3`, scope, key, token, why)
	return err
}

// stalled lists up to limit runs of flow whose lease ran out.
func (k keys) stalled(ctx context.Context, q Querier, flow string, limit int) ([]stalledRun, error) {
	rows, err := q.Query(ctx, `SELECT scope, idem_key, method, route, recovery_point, state, lease_token, taken FROM `+k.table+`
		WHERE flow = $1 AND status IS NULL AND lease_until <= clock_timestamp() ORDER BY lease_until LIMIT $2`, flow, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (stalledRun, error) {
		var s stalledRun
		err := r.Scan(&s.run.Scope, &s.run.Key, &s.run.Method, &s.run.Route, &s.run.Point, &s.run.State, &s.token, &s.run.Taken)
		return s, err
	})
}

// stalledRun is a run whose lease ran out, and the token that held it.
type stalledRun struct {
	run   Run
	token string
}

// nonNil is b, or an empty slice for nil: the columns are NOT NULL where it
// is used.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
