package idempotency

import (
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

// stored is a key's row: the request it is for and, once completed, its
// response.
type stored struct {
	method, route string
	fingerprint   []byte
	status        int // 0 while a phased run is in progress
	headers, body []byte
	createdAt     time.Time
	expired       bool
	run           *running // a phased request's run in progress, else nil
}

// running is the in-progress part of a phased request's row: what a
// request that finds it needs to know. A takeover reads the rest itself.
type running struct {
	flow      string
	leaseLeft time.Duration // <= 0: the lease ran out
}

// lockName names (scope, key) for its advisory lock; every part is
// length-prefixed, so two different keys never share a name.
func (k keys) lockName(scope, key string) string {
	return strconv.Itoa(len(k.schema)) + ":" + k.schema + strconv.Itoa(len(scope)) + ":" + scope + key
}

// selectStored reads a key's row; scanStored scans it.
const selectStored = `SELECT method, route, fingerprint, status, headers, body, created_at, expires_at <= clock_timestamp(),
	flow, extract(epoch FROM lease_until - clock_timestamp())::float8 FROM `

// scanStored scans a row of selectStored; a missing row is nil.
func scanStored(r pgx.Row) (*stored, error) {
	var s stored
	var status *int32
	var flow *string
	var leaseLeft *float64
	err := r.Scan(&s.method, &s.route, &s.fingerprint, &status, &s.headers, &s.body, &s.createdAt, &s.expired, &flow, &leaseLeft)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if status != nil {
		s.status = int(*status)
		return &s, nil
	}
	// In progress: never expired while it runs, whatever expires_at says.
	s.expired = false
	s.run = &running{flow: deref(flow)}
	if leaseLeft != nil {
		s.run.leaseLeft = seconds(*leaseLeft)
	}
	return &s, nil
}

// deref is *p, or T's zero value for nil (a NULL column).
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// queueClaim adds to b, a transaction's first round trip, the claim of
// (scope, key): its advisory lock, held until the transaction ends, so that
// no other request with the key runs meanwhile, in this process or
// another. Without wait it does not wait for a holder (*got is false);
// with one it waits that long (then the statement fails with a lock
// timeout). Then it reads the key's row into *row, in a statement of its
// own, so that the read sees what a holder that just finished committed.
func (k keys) queueClaim(b *pgx.Batch, scope, key, idleTimeout string, wait time.Duration, got *bool, row **stored) {
	name := k.lockName(scope, key)
	// The transaction's idle timeout is set by the same statement ("": the
	// server's is kept).
	idle := `set_config('idle_in_transaction_session_timeout', coalesce(nullif($2, ''), current_setting('idle_in_transaction_session_timeout')), true)`
	if wait > 0 {
		// Bounded by a lock_timeout of its own; the one in force before
		// is kept in a setting of the transaction and put back after.
		b.Queue(`SELECT set_config('kafkaonce.lock_timeout_before', current_setting('lock_timeout'), true),
			set_config('lock_timeout', $1, true), `+idle, strconv.FormatInt(max(wait.Milliseconds(), 1), 10), idleTimeout) // 0 would wait for ever
		b.Queue(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, name)
		b.Queue(`SELECT set_config('lock_timeout', current_setting('kafkaonce.lock_timeout_before'), true)`)
		*got = true
	} else {
		b.Queue(`SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0)), `+idle, name, idleTimeout).
			QueryRow(func(r pgx.Row) error { var set string; return r.Scan(got, &set) })
	}
	k.queueRead(b, scope, key, row)
}

// queueRead adds to b a read of the key's row into *row (nil: none).
func (k keys) queueRead(b *pgx.Batch, scope, key string, row **stored) {
	b.Queue(selectStored+k.table+` WHERE scope = $1 AND idem_key = $2`, scope, key).
		QueryRow(func(r pgx.Row) error {
			s, err := scanStored(r)
			*row = s
			return err
		})
}

// queueForget adds the deletion of an expired key's row to b, so that the
// request can store the key afresh.
func (k keys) queueForget(b *pgx.Batch, scope, key string) {
	b.Queue(`DELETE FROM `+k.table+` WHERE scope = $1 AND idem_key = $2`, scope, key)
}

// queueComplete adds to b the key's row, with its request and response.
func (k keys) queueComplete(b *pgx.Batch, scope, key string, s *stored, retention time.Duration) {
	b.Queue(`INSERT INTO `+k.table+` (scope, idem_key, method, route, fingerprint, status, headers, body, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, clock_timestamp() + $9::interval)`,
		scope, key, s.method, s.route, s.fingerprint, s.status, s.headers, s.body, interval(retention))
}
