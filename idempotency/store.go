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

// Key is a stored key: the request it completed and its response.
type Key struct {
	Scope, Key    string
	Method, Route string
	// Fingerprint is the SHA-256 a retry must match.
	Fingerprint []byte
	// Status, Header and Body are the response, as replayed.
	Status    int
	Header    map[string][]string
	Body      []byte
	CreatedAt time.Time
	ExpiresAt time.Time
}

// Get returns the stored key, or ErrNotFound. An expired key is returned
// until it is pruned (its ExpiresAt says so).
func (s *Store) Get(ctx context.Context, q Querier, scope, key string) (Key, error) {
	k := Key{Scope: scope, Key: key}
	var headers []byte
	err := q.QueryRow(ctx, `SELECT method, route, fingerprint, status, headers, body, created_at, expires_at
		FROM `+s.keys.table+` WHERE scope = $1 AND idem_key = $2`, scope, key).
		Scan(&k.Method, &k.Route, &k.Fingerprint, &k.Status, &headers, &k.Body, &k.CreatedAt, &k.ExpiresAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrNotFound
	}
	if err != nil {
		return Key{}, fmt.Errorf("idempotency: get key: %w", err)
	}
	k.Header = decodeHeaders(headers)
	return k, nil
}

// Count returns how many keys are stored, and how many of them expired
// (pruning deletes those).
func (s *Store) Count(ctx context.Context, q Querier) (total, expired int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE expires_at <= clock_timestamp()) FROM `+s.keys.table).Scan(&total, &expired)
	if err != nil {
		return 0, 0, fmt.Errorf("idempotency: count keys: %w", err)
	}
	return total, expired, nil
}

// Prune deletes up to limit expired keys, skipping rows locked by running
// transactions, and returns how many it deleted. Call it until it returns
// less than limit.
func (s *Store) Prune(ctx context.Context, q Querier, limit int) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM `+s.keys.table+` WHERE ctid IN (
		SELECT ctid FROM `+s.keys.table+` WHERE expires_at <= clock_timestamp() LIMIT $1 FOR UPDATE SKIP LOCKED)`, limit)
	if err != nil {
		return 0, fmt.Errorf("idempotency: prune keys: %w", err)
	}
	return tag.RowsAffected(), nil
}
