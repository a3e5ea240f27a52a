package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Querier runs the Store's statements: *pgxpool.Pool, *pgxpool.Conn,
// *pgx.Conn and pgx.Tx all satisfy it, so a call runs on its own or inside
// a transaction of the caller's.
type Querier = kafkaoncetype.Querier

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
	Scope  string `json:"scope"`
	Key    string `json:"key"`
	Method string `json:"method"`
	Route  string `json:"route"`
	// Fingerprint is the SHA-256 a retry must match.
	Fingerprint []byte `json:"fingerprint"`
	// Status, Header and Body are the response, as replayed; Status is 0
	// while a phased request's run is in progress.
	Status    int                 `json:"status"`
	Header    map[string][]string `json:"header"`
	Body      []byte              `json:"body"`
	CreatedAt time.Time           `json:"created_at"`
	ExpiresAt time.Time           `json:"expires_at"`
	// Run is where a phased request's run stands while it is in
	// progress, else nil.
	Run *RunInProgress `json:"run"`
	// Phased is the history of a phased request's run, in progress or
	// complete; nil for a key of a plain handler.
	Phased *RunHistory `json:"phased"`
}

// RunInProgress is where a phased request's run stands (see Flow).
type RunInProgress struct {
	// RecoveryPoint is the phase a resume continues from.
	RecoveryPoint string `json:"recovery_point"`
	// LeaseUntil is when a retry or the sweep may take the run over.
	LeaseUntil time.Time `json:"lease_until"`
	// SweepAfter is when the recovery sweep may take it over, after a
	// failed phase (zero: as soon as the lease runs out).
	SweepAfter time.Time `json:"sweep_after"`
}

// RunHistory is what a phased request's run went through.
type RunHistory struct {
	// Flow names the Flow.
	Flow string `json:"flow"`
	// RunID is the run's own id, from which Run.DerivedKey derives
	// (DerivedKey below gives the same keys).
	RunID string `json:"run_id"`
	// Taken counts the times the run was taken: 1 by its first request,
	// one more at each resume.
	Taken int `json:"taken"`
	// LastError is the last failure of one of its phases, if any, and
	// LastErrorAt when it was recorded.
	LastError   string    `json:"last_error"`
	LastErrorAt time.Time `json:"last_error_at"`
	// GivenUpAt is when the run was given up, and GiveUpReason why; zero
	// for a run that completed or is in progress.
	GivenUpAt    time.Time `json:"given_up_at"`
	GiveUpReason string    `json:"give_up_reason"`

	scope, key string
}

// DerivedKey is the key the run's phases got from Run.DerivedKey for
// purpose: what to look the run's calls up by at a provider.
func (h *RunHistory) DerivedKey(purpose string) string {
	r := Run{Scope: h.scope, Key: h.key, id: h.RunID}
	return r.DerivedKey(purpose)
}

// Get returns the stored key, or ErrNotFound. An expired key is returned
// until it is pruned (its ExpiresAt says so).
func (s *Store) Get(ctx context.Context, q Querier, scope, key string) (Key, error) {
	k := Key{Scope: scope, Key: key}
	var headers []byte
	var status *int32
	var flow, runID, point, lastError, giveUpReason *string
	var leaseUntil, sweepAfter, lastErrorAt, givenUpAt *time.Time
	var taken int
	err := q.QueryRow(ctx, `SELECT method, route, fingerprint, status, headers, body, created_at, expires_at,
			flow, run_id, recovery_point, lease_until, sweep_after, taken, last_error, last_error_at, given_up_at, give_up_reason
		FROM `+s.keys.table+` WHERE scope = $1 AND idem_key = $2`, scope, key).
		Scan(&k.Method, &k.Route, &k.Fingerprint, &status, &headers, &k.Body, &k.CreatedAt, &k.ExpiresAt,
			&flow, &runID, &point, &leaseUntil, &sweepAfter, &taken, &lastError, &lastErrorAt, &givenUpAt, &giveUpReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return Key{}, ErrNotFound
	}
	if err != nil {
		return Key{}, fmt.Errorf("idempotency: get key: %w", err)
	}
	if flow != nil {
		k.Phased = &RunHistory{Flow: *flow, RunID: deref(runID), Taken: taken, LastError: deref(lastError),
			LastErrorAt: deref(lastErrorAt), GivenUpAt: deref(givenUpAt), GiveUpReason: deref(giveUpReason),
			scope: scope, key: key}
	}
	if status == nil {
		k.Run = &RunInProgress{RecoveryPoint: deref(point), LeaseUntil: deref(leaseUntil), SweepAfter: deref(sweepAfter)}
		return k, nil
	}
	k.Status = int(*status)
	if k.Header, err = decodeHeaders(headers, nil); err != nil {
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
	// GivenUp counts the completed keys whose run was given up.
	GivenUp int64
}

// Count counts the keys.
func (s *Store) Count(ctx context.Context, q Querier) (Counts, error) {
	var c Counts
	err := q.QueryRow(ctx, `SELECT count(*),
			count(*) FILTER (WHERE status IS NOT NULL AND expires_at <= clock_timestamp()),
			count(*) FILTER (WHERE status IS NULL),
			count(*) FILTER (WHERE status IS NULL AND lease_until <= clock_timestamp()),
			count(*) FILTER (WHERE given_up_at IS NOT NULL)
		FROM `+s.keys.table).Scan(&c.Total, &c.Expired, &c.Running, &c.Stalled, &c.GivenUp)
	if err != nil {
		return Counts{}, fmt.Errorf("idempotency: count keys: %w", err)
	}
	return c, nil
}

// Pruner is Prune as a consumer runs it: given in consumer.Config.Pruners,
// a consumer with Prune.Interval set deletes the schema's expired keys in
// the background, with its own old claims, so that an API needs no pruning
// loop of its own.
func (s *Store) Pruner() kafkaoncetype.Pruner {
	return kafkaoncetype.Pruner{
		Table: "expired idempotency_keys",
		Step: func(ctx context.Context, q kafkaoncetype.Querier, limit int) (int64, error) {
			return s.Prune(ctx, q, limit)
		},
	}
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
