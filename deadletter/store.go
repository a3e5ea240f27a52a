package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// ErrNotFound is returned by Get for an id that has no letter.
var ErrNotFound = errors.New("deadletter: no such letter")

// Store reads dead_letters in one schema, and asks for redrives.
type Store struct {
	table string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("deadletter: schema name %w", err)
	}
	return &Store{table: schema.Table(schemaName, "dead_letters")}, nil
}

const columns = `id, consumer, topic, partition, kafka_offset, coalesce(message_id, ''), message_key, message_value, headers,
	` + metaColumns

// withoutPayload are columns with the message's key, value and headers
// left out (a listing that does not show them reads no payload).
const withoutPayload = `id, consumer, topic, partition, kafka_offset, coalesce(message_id, ''), NULL::bytea, NULL::bytea, 'null'::jsonb,
	` + metaColumns

const metaColumns = `coalesce(message_time, 'epoch'), error_class, error, attempts, first_failed_at, last_failed_at, dead_lettered_at, published_at, redriven_at,
	redrive_requested_at, coalesce(redrive_error, ''), settled_at, retry_at, retries`

func scan(row pgx.Row) (Letter, error) {
	var l Letter
	var headers []byte
	err := row.Scan(&l.ID, &l.Consumer, &l.Topic, &l.Partition, &l.Offset, &l.MessageID, &l.Key, &l.Value, &headers,
		&l.MessageTime, &l.Class, &l.Error, &l.Attempts, &l.FirstFailedAt, &l.LastFailedAt, &l.DeadLetteredAt, &l.PublishedAt, &l.RedrivenAt,
		&l.RedriveRequestedAt, &l.RedriveError, &l.SettledAt, &l.RetryAt, &l.Retries)
	if err != nil {
		return Letter{}, err
	}
	if l.MessageTime.Unix() == 0 {
		l.MessageTime = time.Time{}
	}
	if err := json.Unmarshal(headers, &l.Headers); err != nil {
		return Letter{}, fmt.Errorf("deadletter: decode headers of letter %d: %w", l.ID, err)
	}
	return l, nil
}

// Get returns one letter by id.
func (s *Store) Get(ctx context.Context, q Querier, id int64) (Letter, error) {
	l, err := scan(q.QueryRow(ctx, `SELECT `+columns+` FROM `+s.table+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Letter{}, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return Letter{}, fmt.Errorf("deadletter: get %d: %w", id, err)
	}
	return l, nil
}

// Filter selects letters. Zero fields select everything.
type Filter struct {
	Consumer string
	Topic    string
	// Partition selects one partition when Topic is set and HasPartition.
	Partition    int
	HasPartition bool
	Class        Class
	// IDs selects these letters only.
	IDs []int64
	// Pending selects the open letters: neither redriven nor settled.
	Pending bool
	// Unpublished selects letters not published to a dead-letter topic
	// yet, less those of class ClassRetryLater: a message the consumer
	// retries by itself reaches the topic only once its retries run out
	// (its class is then ClassRetriesExhausted).
	Unpublished bool
	// RedriveRequested selects letters an operator asked to redrive that
	// are not redriven yet.
	RedriveRequested bool
	// RetryDue selects open letters whose RetryAt has come.
	RetryDue bool
	// AfterID pages through results: letters with a larger id.
	AfterID int64
	// Limit bounds the result (default 100, at most 10000).
	Limit int
	// WithoutPayload leaves each letter's Key, Value and Headers empty,
	// and unread: for a listing that does not show them, so that large
	// messages cost it nothing.
	WithoutPayload bool
}

// List returns the letters matching f, oldest first.
func (s *Store) List(ctx context.Context, q Querier, f Filter) ([]Letter, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.Consumer != "" {
		add("consumer = $%d", f.Consumer)
	}
	if f.Topic != "" {
		add("topic = $%d", f.Topic)
		if f.HasPartition {
			add("partition = $%d", f.Partition)
		}
	}
	if f.Class != "" {
		add("error_class = $%d", string(f.Class))
	}
	if len(f.IDs) > 0 {
		add("id = ANY($%d)", f.IDs)
	}
	if f.Pending {
		where = append(where, "redriven_at IS NULL AND settled_at IS NULL")
	}
	if f.Unpublished {
		where = append(where, "published_at IS NULL AND error_class <> 'retry_later'")
	}
	if f.RedriveRequested {
		where = append(where, "redrive_requested_at IS NOT NULL AND redriven_at IS NULL AND settled_at IS NULL")
	}
	if f.RetryDue {
		where = append(where, "retry_at <= now() AND redriven_at IS NULL AND settled_at IS NULL")
	}
	if f.AfterID > 0 {
		add("id > $%d", f.AfterID)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 10000)
	cols := columns
	if f.WithoutPayload {
		cols = withoutPayload
	}
	sql := `SELECT ` + cols + ` FROM ` + s.table
	if len(where) > 0 {
		sql += ` WHERE ` + strings.Join(where, " AND ")
	}
	sql += fmt.Sprintf(` ORDER BY id LIMIT %d`, limit)
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("deadletter: list: %w", err)
	}
	defer rows.Close()
	var out []Letter
	for rows.Next() {
		l, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("deadletter: list: %w", err)
	}
	return out, nil
}

// RequestRedrive asks the running consumer that owns the letters to redrive
// them (an operator's tool has no handler to run them with). It returns how
// many pending letters were marked. A request's time identifies it: a
// request that replaces a pending one gets a later time even if the clock
// says otherwise, so that the failure of an attempt that answered the
// earlier request does not withdraw it.
func (s *Store) RequestRedrive(ctx context.Context, q Querier, consumer string, ids []int64) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE `+s.table+` SET redrive_requested_at = greatest(now(), redrive_requested_at + interval '1 microsecond'), redrive_error = NULL
WHERE consumer = $1 AND id = ANY($2) AND redriven_at IS NULL AND settled_at IS NULL`, consumer, ids)
	if err != nil {
		return 0, fmt.Errorf("deadletter: request redrive: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Settle closes open letters of a consumer without a redrive, for an
// operator whose fix made their effects by other means (or who decided
// they are not wanted), and withdraws any redrive request of theirs. It
// returns how many open letters it settled: a letter redriven or settled
// before is left as it was. A redrive that holds a letter's lock finishes
// first; one that comes after finds the letter settled and leaves it.
func (s *Store) Settle(ctx context.Context, q Querier, consumer string, ids []int64) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE `+s.table+` SET settled_at = now(), redrive_requested_at = NULL
WHERE consumer = $1 AND id = ANY($2) AND redriven_at IS NULL AND settled_at IS NULL`, consumer, ids)
	if err != nil {
		return 0, fmt.Errorf("deadletter: settle: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Counts are a consumer's letters, told apart by what they wait for.
type Counts struct {
	// Letters counts the dead letters (every class but ClassRetryLater),
	// and Open those of them neither redriven nor settled: what waits for
	// an operator.
	Letters, Open int64
	// Waiting counts the messages set aside to be retried later whose
	// retries are still to come (see Waiting), and NextRetry is when the
	// first of them is due (zero without any).
	Waiting   int64
	NextRetry time.Time
	// AppliedOnRetry counts the messages set aside for later that a retry
	// applied.
	AppliedOnRetry int64
}

// Count counts a consumer's letters (see Counts).
func (s *Store) Count(ctx context.Context, q Querier, consumer string) (Counts, error) {
	var c Counts
	var next *time.Time
	err := q.QueryRow(ctx, `SELECT
    count(*) FILTER (WHERE error_class <> $2),
    count(*) FILTER (WHERE error_class <> $2 AND redriven_at IS NULL AND settled_at IS NULL),
    count(*) FILTER (WHERE `+waitingToRetry+`),
    min(retry_at) FILTER (WHERE `+waitingToRetry+`),
    count(*) FILTER (WHERE error_class = $2 AND redriven_at IS NOT NULL)
FROM `+s.table+` WHERE consumer = $1`, consumer, string(ClassRetryLater)).Scan(&c.Letters, &c.Open, &c.Waiting, &next, &c.AppliedOnRetry)
	if err != nil {
		return Counts{}, fmt.Errorf("deadletter: count: %w", err)
	}
	if next != nil {
		c.NextRetry = *next
	}
	return c, nil
}

// waitingToRetry is the condition of a letter whose retries are still to
// come: the one of the partial index dead_letters_retry_due (migration
// 021), so that Waiting reads that index alone.
const waitingToRetry = `retry_at IS NOT NULL AND redriven_at IS NULL AND settled_at IS NULL`

// Waiting counts the consumer's messages set aside to be retried later
// whose retries are still to come, and says when the first is due (zero
// without any). A letter whose retries ran out is a dead letter of class
// ClassRetriesExhausted, and is not counted.
func (s *Store) Waiting(ctx context.Context, q Querier, consumer string) (n int64, next time.Time, err error) {
	var at *time.Time
	if err := q.QueryRow(ctx, `SELECT count(*), min(retry_at) FROM `+s.table+` WHERE consumer = $1 AND `+waitingToRetry, consumer).Scan(&n, &at); err != nil {
		return 0, time.Time{}, fmt.Errorf("deadletter: count the messages waiting to be retried: %w", err)
	}
	if at != nil {
		next = *at
	}
	return n, next, nil
}

// ClassCount counts a consumer's letters of one class.
type ClassCount struct {
	Consumer string
	Class    Class
	Total    int64
	// Pending counts the open ones: neither redriven nor settled.
	Pending int64
	// Waiting counts the open ones whose retries are still to come (of
	// ClassRetryLater only).
	Waiting int64
}

// CountByClass counts every consumer's letters by class, ordered by
// consumer and class.
func (s *Store) CountByClass(ctx context.Context, q Querier) ([]ClassCount, error) {
	rows, err := q.Query(ctx, `SELECT consumer, error_class, count(*), count(*) FILTER (WHERE redriven_at IS NULL AND settled_at IS NULL),
    count(*) FILTER (WHERE `+waitingToRetry+`)
FROM `+s.table+` GROUP BY consumer, error_class ORDER BY consumer, error_class`)
	if err != nil {
		return nil, fmt.Errorf("deadletter: count by class: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ClassCount])
	if err != nil {
		return nil, fmt.Errorf("deadletter: count by class: %w", err)
	}
	return out, nil
}
