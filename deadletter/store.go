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

// Store reads and writes dead_letters in one schema.
type Store struct {
	table     string
	insertSQL string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("deadletter: schema name %w", err)
	}
	t := schema.Table(schemaName, "dead_letters")
	return &Store{
		table: t,
		// The same message may be set aside twice (a batch run again after
		// an unknown COMMIT outcome, two members racing on a partition);
		// the first letter stands. A letter is unique per message, not per
		// offset (see migration 008): after a topic is re-created and its
		// positions reset, another message at the offset of an old letter
		// gets a letter of its own.
		insertSQL: `INSERT INTO ` + t + ` (consumer, topic, partition, kafka_offset, message_id, message_key, message_value,
	headers, message_time, error_class, error, attempts, first_failed_at, last_failed_at)
SELECT $1, $2, $3, l.kafka_offset, l.message_id, l.message_key, l.message_value, l.headers, l.message_time,
	l.error_class, l.error, l.attempts, l.first_failed_at, l.last_failed_at
FROM unnest($4::bigint[], $5::text[], $6::bytea[], $7::bytea[], $8::jsonb[], $9::timestamptz[], $10::text[], $11::text[],
	$12::int[], $13::timestamptz[], $14::timestamptz[])
	AS l(kafka_offset, message_id, message_key, message_value, headers, message_time, error_class, error, attempts, first_failed_at, last_failed_at)
ON CONFLICT (consumer, topic, partition, kafka_offset, fingerprint, (coalesce(message_id, '')), (coalesce(message_time, '-infinity'::timestamptz)))
DO NOTHING`,
	}, nil
}

// Table is the quoted, schema-qualified table name.
func (s *Store) Table() string { return s.table }

// QueueInsert adds to b the insert of letters, all of one consumer, topic
// and partition. The letters' ID, DeadLetteredAt, PublishedAt and RedrivenAt
// are ignored.
func (s *Store) QueueInsert(b *pgx.Batch, consumer, topic string, partition int, letters []Letter) error {
	n := len(letters)
	offsets := make([]int64, n)
	ids := make([]*string, n)
	keys := make([][]byte, n)
	values := make([][]byte, n)
	headers := make([]string, n)
	times := make([]*time.Time, n)
	classes := make([]string, n)
	errs := make([]string, n)
	attempts := make([]int32, n)
	firsts := make([]time.Time, n)
	lasts := make([]time.Time, n)
	for i := range letters {
		l := &letters[i]
		offsets[i] = l.Offset
		if l.MessageID != "" {
			ids[i] = &l.MessageID
		}
		keys[i], values[i] = l.Key, l.Value
		h := l.Headers
		if h == nil {
			h = []Header{}
		}
		raw, err := json.Marshal(h)
		if err != nil {
			return fmt.Errorf("deadletter: encode headers: %w", err)
		}
		headers[i] = string(raw)
		if storableTime(l.MessageTime) {
			times[i] = &l.MessageTime
		}
		classes[i] = string(l.Class)
		errs[i] = truncateError(l.Error)
		attempts[i] = int32(l.Attempts)
		firsts[i], lasts[i] = l.FirstFailedAt, l.LastFailedAt
	}
	b.Queue(s.insertSQL, consumer, topic, partition, offsets, ids, keys, values, headers, times, classes, errs, attempts, firsts, lasts)
	return nil
}

const columns = `id, consumer, topic, partition, kafka_offset, coalesce(message_id, ''), message_key, message_value, headers,
	coalesce(message_time, 'epoch'), error_class, error, attempts, first_failed_at, last_failed_at, dead_lettered_at, published_at, redriven_at,
	redrive_requested_at, coalesce(redrive_error, '')`

func scan(row pgx.Row) (Letter, error) {
	var l Letter
	var headers []byte
	err := row.Scan(&l.ID, &l.Consumer, &l.Topic, &l.Partition, &l.Offset, &l.MessageID, &l.Key, &l.Value, &headers,
		&l.MessageTime, &l.Class, &l.Error, &l.Attempts, &l.FirstFailedAt, &l.LastFailedAt, &l.DeadLetteredAt, &l.PublishedAt, &l.RedrivenAt,
		&l.RedriveRequestedAt, &l.RedriveError)
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
func (s *Store) Get(ctx context.Context, q schema.Querier, id int64) (Letter, error) {
	l, err := scan(q.QueryRow(ctx, `SELECT `+columns+` FROM `+s.table+` WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Letter{}, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return Letter{}, fmt.Errorf("deadletter: get %d: %w", id, err)
	}
	return l, nil
}

// GetForUpdate returns one letter of a consumer and locks it until tx ends,
// so that two redrives of one letter run one after the other.
func (s *Store) GetForUpdate(ctx context.Context, tx pgx.Tx, consumer string, id int64) (Letter, error) {
	l, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM `+s.table+` WHERE id = $1 AND consumer = $2 FOR UPDATE`, id, consumer))
	if errors.Is(err, pgx.ErrNoRows) {
		return Letter{}, fmt.Errorf("%w: %d (of consumer %q)", ErrNotFound, id, consumer)
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
	// Pending selects letters not redriven yet.
	Pending bool
	// Unpublished selects letters not published to a dead-letter topic yet.
	Unpublished bool
	// RedriveRequested selects letters an operator asked to redrive that
	// are not redriven yet.
	RedriveRequested bool
	// AfterID pages through results: letters with a larger id.
	AfterID int64
	// Limit bounds the result (default 100, at most 10000).
	Limit int
}

// List returns the letters matching f, oldest first.
func (s *Store) List(ctx context.Context, q schema.Querier, f Filter) ([]Letter, error) {
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
		where = append(where, "redriven_at IS NULL")
	}
	if f.Unpublished {
		where = append(where, "published_at IS NULL")
	}
	if f.RedriveRequested {
		where = append(where, "redrive_requested_at IS NOT NULL AND redriven_at IS NULL")
	}
	if f.AfterID > 0 {
		add("id > $%d", f.AfterID)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 10000)
	sql := `SELECT ` + columns + ` FROM ` + s.table
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

// MarkRedriven records that a redrive applied the letter's message.
func (s *Store) MarkRedriven(ctx context.Context, q schema.Querier, id int64) error {
	if _, err := q.Exec(ctx, `UPDATE `+s.table+` SET redriven_at = now() WHERE id = $1`, id); err != nil {
		return fmt.Errorf("deadletter: mark %d redriven: %w", id, err)
	}
	return nil
}

// RequestRedrive asks the running consumer that owns the letters to redrive
// them (an operator's tool has no handler to run them with). It returns how
// many pending letters were marked.
func (s *Store) RequestRedrive(ctx context.Context, q schema.Querier, consumer string, ids []int64) (int64, error) {
	tag, err := q.Exec(ctx, `UPDATE `+s.table+` SET redrive_requested_at = now(), redrive_error = NULL
WHERE consumer = $1 AND id = ANY($2) AND redriven_at IS NULL`, consumer, ids)
	if err != nil {
		return 0, fmt.Errorf("deadletter: request redrive: %w", err)
	}
	return tag.RowsAffected(), nil
}

// MarkRedriveFailed records why a requested redrive failed, and withdraws
// the request so it is not retried in a loop.
func (s *Store) MarkRedriveFailed(ctx context.Context, q schema.Querier, id int64, reason string) error {
	if _, err := q.Exec(ctx, `UPDATE `+s.table+` SET redrive_requested_at = NULL, redrive_error = $2 WHERE id = $1`, id, truncateError(reason)); err != nil {
		return fmt.Errorf("deadletter: mark redrive of %d failed: %w", id, err)
	}
	return nil
}

// MarkPublished records that letters were published to the dead-letter
// topic.
func (s *Store) MarkPublished(ctx context.Context, q schema.Querier, ids []int64) error {
	if _, err := q.Exec(ctx, `UPDATE `+s.table+` SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL`, ids); err != nil {
		return fmt.Errorf("deadletter: mark published: %w", err)
	}
	return nil
}

// Count returns how many letters a consumer has, and how many of them are
// not redriven yet.
func (s *Store) Count(ctx context.Context, q schema.Querier, consumer string) (total, pending int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE redriven_at IS NULL) FROM `+s.table+` WHERE consumer = $1`, consumer).Scan(&total, &pending)
	if err != nil {
		return 0, 0, fmt.Errorf("deadletter: count: %w", err)
	}
	return total, pending, nil
}

// Kafka timestamps are any int64 of milliseconds a producer sends; a
// timestamptz holds years 4713 BC to 294276 AD (and pgx's encoding less
// than that at the far end). A letter keeps a message time it can store;
// beyond these bounds (a producer's bug) it stores none rather than fail,
// which would keep the message from being set aside at all.
var (
	earliestTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	latestTime   = time.Date(294275, 1, 1, 0, 0, 0, 0, time.UTC)
)

func storableTime(t time.Time) bool {
	return !t.IsZero() && !t.Before(earliestTime) && t.Before(latestTime)
}
