package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Querier runs the Store's statements: *pgxpool.Pool, *pgxpool.Conn,
// *pgx.Conn and pgx.Tx all satisfy it, so a call runs on its own or inside
// a transaction of the caller's.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNotFound is returned by Store.Get for a key that is not stored.
var ErrNotFound = errors.New("idempotency: no such key")

// Store is the operations API on the stored keys, for operators' tools:
// look a key up, count, prune. The Server writes them.
type Store struct {
	keys keys
}

// NewStore returns the Store of the keys in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("idempotency: schema %w", err)
	}
	return &Store{keys: newKeys(schemaName)}, nil
}

// Key is a stored key: the request it is for and, once completed, its
// response.
type Key struct {
	Scope, Key    string
	Method, Route string
	// Fingerprint is the SHA-256 a retry must match.
	Fingerprint []byte
	// Status, Header and Body are the response, as replayed; Status is 0
	// while a phased request's run is in progress.
	Status    int
	Header    map[string][]string
	Body      []byte
	CreatedAt time.Time
	ExpiresAt time.Time
	// Run is a phased request's run in progress, else nil.
	Run *RunInProgress
}

// RunInProgress is where a phased request's run stands (see Flow).
type RunInProgress struct {
	// Flow names the Flow; RecoveryPoint is the phase a resume continues
	// from.
	Flow, RecoveryPoint string
	// LeaseUntil is when a retry or the sweep may take the run over.
	LeaseUntil time.Time
	// Taken counts the servers that ran it: 1, plus one per resume.
	Taken int
	// LastError is why its last phase failed, if it did.
	LastError string
}

// Get returns the stored key, or ErrNotFound. An expired key is returned
// until it is pruned (its ExpiresAt says so).
func (s *Store) Get(ctx context.Context, q Querier, scope, key string) (Key, error) {
	k := Key{Scope: scope, Key: key}
	var headers []byte
	var status *int32
	var flow, point, lastError *string
	var leaseUntil *time.Time
	var taken int
	err := q.QueryRow(ctx, `SELECT method, route, fingerprint, status, headers, body, created_at, expires_at,
			flow, recovery_point, lease_until, taken, last_error
		FROM `+s.keys.table+` WHERE scope = $1 AND idem_key = $2`, scope, key).
		Scan(&k.Method, &k.Route, &k.Fingerprint, &status, &headers, &k.Body, &k.CreatedAt, &k.ExpiresAt,
			&flow, &point, &leaseUntil, &taken, &lastError)
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrNotFound
	}
	if err != nil {
		return Key{}, fmt.Errorf("idempotency: get key: %w", err)
	}
	if status == nil {
		k.Run = &RunInProgress{Flow: deref(flow), RecoveryPoint: deref(point), Taken: taken, LastError: deref(lastError)}
		if leaseUntil != nil {
			k.Run.LeaseUntil = *leaseUntil
		}
		return k, nil
	}
	k.Status = int(*status)
	if k.Header, err = decodeHeaders(headers); err != nil {
		return k, fmt.Errorf("idempotency: get key: %w", err)
	}
	return k, nil
}

// Counts are the numbers of keys in a schema.
type Counts struct {
	// Total counts every key; Expired the completed ones past their
	// retention, which pruning deletes.
	Total, Expired int64
	// Running counts phased requests' runs in progress; Stalled those of
	// them whose lease ran out, waiting for a retry or the recovery sweep.
	Running, Stalled int64
}

// Count counts the keys.
func (s *Store) Count(ctx context.Context, q Querier) (Counts, error) {
	var c Counts
	err := q.QueryRow(ctx, `SELECT count(*),
			count(*) FILTER (WHERE status IS NOT NULL AND expires_at <= clock_timestamp()),
			count(*) FILTER (WHERE status IS NULL),
			count(*) FILTER (WHERE status IS NULL AND lease_until <= clock_timestamp())
		FROM `+s.keys.table).Scan(&c.Total, &c.Expired, &c.Running, &c.Stalled)
	if err != nil {
		return Counts{}, fmt.Errorf("idempotency: count keys: %w", err)
	}
	return c, nil
}

// Prune deletes up to limit expired keys, skipping rows locked by running
// transactions, and returns how many it deleted. A run in progress is
// never pruned, however old: its recovery point is all that says how far
// its request went. Call it until it returns less than limit.
func (s *Store) Prune(ctx context.Context, q Querier, limit int) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM `+s.keys.table+` WHERE ctid IN (
		SELECT ctid FROM `+s.keys.table+` WHERE expires_at <= clock_timestamp() AND status IS NOT NULL
		LIMIT $1 FOR UPDATE SKIP LOCKED)`, limit)
	if err != nil {
		return 0, fmt.Errorf("idempotency: prune keys: %w", err)
	}
	return tag.RowsAffected(), nil
}
