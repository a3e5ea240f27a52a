package pauses

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Querier runs the Store's statements: *pgxpool.Pool, *pgxpool.Conn,
// *pgx.Conn and pgx.Tx all satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Pause is a row of the pauses table.
type Pause struct {
	Consumer string
	Scope    Scope
	// At is when it was paused; By and Reason are as the pause gave them.
	At         time.Time
	By, Reason string
}

// Store reads and writes the pauses table in one schema.
type Store struct{ table string }

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("pauses: schema name %w", err)
	}
	return &Store{table: schema.Table(schemaName, "pauses")}, nil
}

// MaxText is the most bytes By and Reason keep; longer ones are cut.
const MaxText = 1000

// Pause pauses scope of consumer, saying who (by) and why (reason). It
// reports false, and changes nothing, when the scope was paused already:
// the first pause's time, author and reason stand.
func (s *Store) Pause(ctx context.Context, q Querier, consumer string, scope Scope, by, reason string) (paused bool, err error) {
	if err := validConsumer(consumer); err != nil {
		return false, err
	}
	if err := scope.Validate(); err != nil {
		return false, err
	}
	topic, partition := scope.row()
	tag, err := q.Exec(ctx, `INSERT INTO `+s.table+` (consumer, topic, partition, paused_by, reason) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING`, consumer, topic, partition, pgtext.Cut(by, MaxText), pgtext.Cut(reason, MaxText))
	if err != nil {
		return false, fmt.Errorf("pauses: pause %s of %s: %w", scope, consumer, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Resume lifts the pause of scope of consumer. It reports false when that
// scope was not paused (a pause of a wider or narrower scope is left as it
// is: see the package doc).
func (s *Store) Resume(ctx context.Context, q Querier, consumer string, scope Scope) (resumed bool, err error) {
	if err := validConsumer(consumer); err != nil {
		return false, err
	}
	if err := scope.Validate(); err != nil {
		return false, err
	}
	topic, partition := scope.row()
	tag, err := q.Exec(ctx, `DELETE FROM `+s.table+` WHERE consumer = $1 AND topic = $2 AND partition = $3`, consumer, topic, partition)
	if err != nil {
		return false, fmt.Errorf("pauses: resume %s of %s: %w", scope, consumer, err)
	}
	return tag.RowsAffected() == 1, nil
}

// List returns the pauses of consumer, widest first: the whole consumer's,
// then by topic, a topic's before its partitions'.
func (s *Store) List(ctx context.Context, q Querier, consumer string) ([]Pause, error) {
	if err := validConsumer(consumer); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `SELECT topic, partition, paused_at, paused_by, reason FROM `+s.table+`
WHERE consumer = $1 ORDER BY topic, partition`, consumer)
	if err != nil {
		return nil, fmt.Errorf("pauses: list %s: %w", consumer, err)
	}
	var out []Pause
	for rows.Next() {
		var topic string
		var partition int
		p := Pause{Consumer: consumer}
		if err := rows.Scan(&topic, &partition, &p.At, &p.By, &p.Reason); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pauses: list %s: %w", consumer, err)
		}
		p.Scope = scopeOfRow(topic, partition)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pauses: list %s: %w", consumer, err)
	}
	return out, nil
}

// Covering returns the first of ps that covers the partition: the widest,
// when ps is in List's order.
func Covering(ps []Pause, topic string, partition int) (Pause, bool) {
	for _, p := range ps {
		if p.Scope.Covers(topic, partition) {
			return p, true
		}
	}
	return Pause{}, false
}

func validConsumer(consumer string) error {
	if consumer == "" {
		return fmt.Errorf("pauses: consumer name is empty: give the consumer's Config.Name")
	}
	if !pgtext.Storable(consumer) {
		return fmt.Errorf("pauses: consumer name %q is not valid UTF-8 or holds a NUL byte: no consumer is named so", consumer)
	}
	return nil
}
