package idempotency

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// keys reads and writes the idempotency_keys table.
type keys struct {
	schema, table string
}

func newKeys(schemaName string) keys {
	return keys{schema: schemaName, table: schema.Table(schemaName, "idempotency_keys")}
}

// stored is a completed key: the request it was for and its response.
type stored struct {
	method, route string
	fingerprint   []byte
	status        int
	headers, body []byte
	createdAt     time.Time
	expired       bool
}

// lockName names (scope, key) for its advisory lock; every part is
// length-prefixed, so two different keys never share a name.
func (k keys) lockName(scope, key string) string {
	return strconv.Itoa(len(k.schema)) + ":" + k.schema + strconv.Itoa(len(scope)) + ":" + scope + key
}

// claim takes (scope, key) for tx: its advisory lock, held until tx ends,
// so that no other request with the key runs meanwhile, in this process or
// another. Without wait it does not wait for a holder (got is false); with
// one it waits that long. In the same round trip it reads the key's row,
// in a statement of its own, so that the read sees what a holder that just
// finished committed.
func (k keys) claim(ctx context.Context, tx pgx.Tx, scope, key string, wait time.Duration) (got bool, row *stored, err error) {
	b := &pgx.Batch{}
	name := k.lockName(scope, key)
	if wait > 0 {
		// Bounded by a lock_timeout of its own; the one in force before
		// is kept in a setting of the transaction and put back after.
		b.Queue(`SELECT set_config('kafkaonce.lock_timeout_before', current_setting('lock_timeout'), true),
			set_config('lock_timeout', $1, true)`, strconv.FormatInt(wait.Milliseconds(), 10))
		b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, name)
		b.Queue(`SELECT set_config('lock_timeout', current_setting('kafkaonce.lock_timeout_before'), true)`)
		got = true
	} else {
		b.Queue(`SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))`, name).
			QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
	}
	b.Queue(`SELECT method, route, fingerprint, status, headers, body, created_at, expires_at <= clock_timestamp()
		FROM `+k.table+` WHERE scope = $1 AND idem_key = $2`, scope, key).
		QueryRow(func(r pgx.Row) error {
			var s stored
			err := r.Scan(&s.method, &s.route, &s.fingerprint, &s.status, &s.headers, &s.body, &s.createdAt, &s.expired)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			row = &s
			return err
		})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return false, nil, err
	}
	return got, row, nil
}

// forget deletes an expired key's row, so that the request can take the
// key afresh.
func (k keys) forget(ctx context.Context, tx pgx.Tx, scope, key string) error {
	_, err := tx.Exec(ctx, `DELETE FROM `+k.table+` WHERE scope = $1 AND idem_key = $2`, scope, key)
	return err
}

// complete stores the key with its request and response, in the request's
// transaction.
func (k keys) complete(ctx context.Context, tx pgx.Tx, scope, key string, s *stored, retention time.Duration) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+k.table+` (scope, idem_key, method, route, fingerprint, status, headers, body, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, clock_timestamp() + $9::interval)`,
		scope, key, s.method, s.route, s.fingerprint, s.status, s.headers, s.body, strconv.FormatInt(retention.Microseconds(), 10)+" microseconds")
	return err
}
