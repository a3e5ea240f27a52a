package pauses

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Querier runs the Store's statements: *pgxpool.Pool, *pgxpool.Conn,
// *pgx.Conn and pgx.Tx all satisfy it.
type Querier = kafkaoncetype.Querier

// Pause is a row of the pauses table.
type Pause struct {
	Consumer string
	Scope    Scope
	// At is when it was paused; By and Reason are as the pause gave them.
	At         time.Time
	By, Reason string
	// Until is when the pause ends by itself (PauseFor), by the database
	// server's clock; zero for a pause that holds until it is resumed.
	Until time.Time
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

// Pause pauses scope of consumer until it is resumed, saying who (by) and
// why (reason). It reports false, and changes nothing, when the scope was
// paused already: the first pause's time, author and reason stand. A pause
// of the scope that ends by itself is made to last until resumed.
func (s *Store) Pause(ctx context.Context, q Querier, consumer string, scope Scope, by, reason string) (paused bool, err error) {
	return s.pause(ctx, q, consumer, scope, nil, by, reason)
}

// PauseFor pauses scope of consumer for d: the pause ends by itself d
// after now by the database server's clock (or earlier, by Resume), and
// every member fetches the partitions it held again at its next read of
// the pauses (each second or so). When the scope was paused already, it
// reports false and the first pause's time, author and reason stand; its
// end moves to now+d if that is later (a pause until resumed stays so).
func (s *Store) PauseFor(ctx context.Context, q Querier, consumer string, scope Scope, d time.Duration, by, reason string) (paused bool, err error) {
	if d < time.Microsecond {
		return false, fmt.Errorf("pauses: a pause for %s would end before it starts: give a duration of at least a microsecond, or use Pause for a pause until resumed", d)
	}
	micros := d.Microseconds()
	return s.pause(ctx, q, consumer, scope, &micros, by, reason)
}

// pause writes a pause of scope lasting micros microseconds (nil: until
// resumed). A row past its end is a lifted pause, replaced as if absent;
// the end of one that holds moves to the later of the two (none is the
// latest).
func (s *Store) pause(ctx context.Context, q Querier, consumer string, scope Scope, micros *int64, by, reason string) (bool, error) {
	if err := validConsumer(consumer); err != nil {
		return false, err
	}
	if err := scope.Validate(); err != nil {
		return false, err
	}
	topic, partition := scope.row()
	var paused bool
	// The row's paused_at is this statement's own clock reading, v.at: a
	// row it inserts or replaces has it, one it keeps an earlier one (a
	// pause made earlier, in this transaction too, whose now() is the same
	// for every statement). So it alone tells a new pause from one kept,
	// and whether the row's pause had ended (until <= v.at, which
	// excluded.paused_at holds), whenever the transaction began.
	err := q.QueryRow(ctx, `WITH v AS (SELECT clock_timestamp() AS at)
INSERT INTO `+s.table+` AS p (consumer, topic, partition, paused_at, paused_by, reason, until)
SELECT $1, $2, $3, v.at, $4, $5, v.at + $6::bigint * interval '1 microsecond' FROM v
ON CONFLICT (consumer, topic, partition) DO UPDATE SET
    paused_at = CASE WHEN p.until <= excluded.paused_at THEN excluded.paused_at ELSE p.paused_at END,
    paused_by = CASE WHEN p.until <= excluded.paused_at THEN excluded.paused_by ELSE p.paused_by END,
    reason    = CASE WHEN p.until <= excluded.paused_at THEN excluded.reason ELSE p.reason END,
    until     = CASE WHEN p.until <= excluded.paused_at THEN excluded.until
                     WHEN p.until IS NULL OR excluded.until IS NULL THEN NULL
                     ELSE greatest(p.until, excluded.until) END
RETURNING p.paused_at = (SELECT at FROM v)`, consumer, topic, partition, pgtext.Cut(by, MaxText), pgtext.Cut(reason, MaxText), micros).Scan(&paused)
	if err != nil {
		return false, fmt.Errorf("pauses: pause %s of %s: %w", scope, consumer, err)
	}
	return paused, nil
}

// Resume lifts the pause of scope of consumer. It reports false when that
// scope was not paused, or its pause had ended by itself (a pause of a
// wider or narrower scope is left as it is: see the package doc).
func (s *Store) Resume(ctx context.Context, q Querier, consumer string, scope Scope) (resumed bool, err error) {
	if err := validConsumer(consumer); err != nil {
		return false, err
	}
	if err := scope.Validate(); err != nil {
		return false, err
	}
	topic, partition := scope.row()
	var held int
	err = q.QueryRow(ctx, `WITH lifted AS (
    DELETE FROM `+s.table+` WHERE consumer = $1 AND topic = $2 AND partition = $3 RETURNING until
)
SELECT count(*) FROM lifted WHERE `+holds, consumer, topic, partition).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("pauses: resume %s of %s: %w", scope, consumer, err)
	}
	return held == 1, nil
}

// List returns the pauses of consumer that hold, widest first: the whole
// consumer's, then by topic, a topic's before its partitions'. A pause
// past its end (by the database server's clock) is not listed: it no
// longer holds.
func (s *Store) List(ctx context.Context, q Querier, consumer string) ([]Pause, error) {
	if err := validConsumer(consumer); err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, `SELECT topic, partition, paused_at, paused_by, reason, until FROM `+s.table+`
WHERE consumer = $1 AND `+holds+` ORDER BY topic, partition`, consumer)
	if err != nil {
		return nil, fmt.Errorf("pauses: list %s: %w", consumer, err)
	}
	var out []Pause
	for rows.Next() {
		var topic string
		var partition int
		var until *time.Time
		p := Pause{Consumer: consumer}
		if err := rows.Scan(&topic, &partition, &p.At, &p.By, &p.Reason, &until); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pauses: list %s: %w", consumer, err)
		}
		p.Scope = scopeOfRow(topic, partition)
		if until != nil {
			p.Until = *until
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pauses: list %s: %w", consumer, err)
	}
	return out, nil
}

// holds is the condition of a row whose pause holds: one past its end, by
// the database server's clock, is lifted. Every statement that reads
// pauses uses it, so that none counts a pause the others call ended. The
// clock is read as the statement runs (clock_timestamp, as pause stamps
// the rows), not at its transaction's start (now()): a long transaction
// would otherwise see pauses hold that ended since it began.
const holds = `(until IS NULL OR until > clock_timestamp())`

// Count returns how many pauses hold for each consumer that has any.
func (s *Store) Count(ctx context.Context, q Querier) (map[string]int, error) {
	rows, err := q.Query(ctx, `SELECT consumer, count(*) FROM `+s.table+` WHERE `+holds+` GROUP BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("pauses: count: %w", err)
	}
	out := map[string]int{}
	var name string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil }); err != nil {
		return nil, fmt.Errorf("pauses: count: %w", err)
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
