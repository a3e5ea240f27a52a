// Package recorded keeps what each consumer records about itself when it
// starts (migration 015): the settings kafkaonce's tools would otherwise
// have to be told again — how it derives message ids, its group, topics and
// brokers. The consumer writes them (Record); the tools read them (Load)
// and use them unless a flag says otherwise.
package recorded

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// maxRecordedBy is the most bytes of RecordedBy kept.
const maxRecordedBy = 500

// The kinds of group a consumer records (Settings.GroupType).
const (
	ConsumerGroup = "consumer"
	ShareGroup    = "share"
)

// Custom is the message id rule recorded for a consumer whose ids come from
// a function of its own (a consumer.MessageIDFunc): no tool can derive them.
const Custom = "custom"

// Settings are a consumer's recorded settings.
type Settings struct {
	Consumer string
	// MessageIDRule is the text of the consumer's id rule (see
	// consumer.MessageIDRule), or Custom.
	MessageIDRule string
	GroupID       string
	// GroupType is the kind of group GroupID is: "consumer" or "share"
	// (Config.GroupType's String). A record written before migration 028
	// loads as "consumer".
	GroupType string
	Topics    []string
	Brokers   []string
	// KafkaTLS says whether the consumer's Dialer uses TLS; KafkaSASL is
	// its SASL mechanism's name ("" for none). Credentials are never
	// recorded.
	KafkaTLS  bool
	KafkaSASL string
	// RecordedAt is when the member that recorded them joined its group,
	// which orders records: the last one's stands.
	RecordedAt time.Time
	// RecordedBy names the worker that recorded them: its host, process
	// id and static instance id ("" when recorded before migration 025).
	RecordedBy string
}

// Store reads and writes the settings in the consumers table of one schema.
type Store struct {
	recordSQL, loadSQL, listSQL, knownSQL string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("recorded: schema name %w", err)
	}
	t := schema.Table(schemaName, "consumers")
	return &Store{
		// A consumer's row exists before (its start numbers its name), but
		// the upsert makes Record stand on its own.
		recordSQL: `INSERT INTO ` + t + ` (name, message_id_rule, group_id, topics, brokers, kafka_tls, kafka_sasl, settings_recorded_at, settings_recorded_by, settings_group_type)
VALUES ($1, $2, $3, $4, $5, $6, nullif($7, ''), coalesce($8, now()), nullif($9, ''), coalesce(nullif($10, ''), 'consumer'))
ON CONFLICT (name) DO UPDATE SET message_id_rule = excluded.message_id_rule, group_id = excluded.group_id,
    topics = excluded.topics, brokers = excluded.brokers, kafka_tls = excluded.kafka_tls,
    kafka_sasl = excluded.kafka_sasl, settings_recorded_at = excluded.settings_recorded_at,
    settings_recorded_by = excluded.settings_recorded_by, settings_group_type = excluded.settings_group_type
-- The record is the last start's: a write that comes late (a retry after
-- the row was locked) never replaces the record of a later start.
WHERE ` + t + `.settings_recorded_at IS NULL OR ` + t + `.settings_recorded_at <= excluded.settings_recorded_at`,
		loadSQL: `SELECT name, message_id_rule, group_id, topics, brokers, kafka_tls, coalesce(kafka_sasl, ''), settings_recorded_at, coalesce(settings_recorded_by, ''), coalesce(settings_group_type, 'consumer')
FROM ` + t + ` WHERE name = $1 AND settings_recorded_at IS NOT NULL`,
		listSQL: `SELECT name, message_id_rule, group_id, topics, brokers, kafka_tls, coalesce(kafka_sasl, ''), settings_recorded_at, coalesce(settings_recorded_by, ''), coalesce(settings_group_type, 'consumer')
FROM ` + t + ` WHERE settings_recorded_at IS NOT NULL ORDER BY name`,
		knownSQL: `SELECT EXISTS (SELECT 1 FROM ` + t + ` WHERE name = $1)`,
	}, nil
}

// Record writes s, replacing what the consumer recorded before unless
// that was recorded for a later start: s.RecordedAt is when the consumer
// started (the database's now() when zero), and a late write of an older
// start changes nothing.
func (st *Store) Record(ctx context.Context, q schema.Querier, s Settings) error {
	if err := s.check(); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, st.recordSQL, st.args(s)...); err != nil {
		return fmt.Errorf("recorded: record the settings of consumer %s: %w", s.Consumer, err)
	}
	return nil
}

// QueueRecord adds to b the statement Record runs, for a caller that sends
// it with others (the consumer, with its session settings).
func (st *Store) QueueRecord(b *pgx.Batch, s Settings) error {
	if err := s.check(); err != nil {
		return err
	}
	b.Queue(st.recordSQL, st.args(s)...)
	return nil
}

func (st *Store) args(s Settings) []any {
	var at *time.Time // now(), the database's clock, when the caller names no start
	if !s.RecordedAt.IsZero() {
		at = &s.RecordedAt
	}
	return []any{s.Consumer, s.MessageIDRule, s.GroupID, s.Topics, s.Brokers, s.KafkaTLS, s.KafkaSASL, at, pgtext.Cut(s.RecordedBy, maxRecordedBy), s.GroupType}
}

func (s Settings) check() error {
	if s.MessageIDRule == "" {
		return errors.New("recorded: the message id rule must be set (recorded.Custom for a function of the consumer's own)")
	}
	return nil
}

// Load returns the settings consumer recorded; ok is false when it has
// recorded none (it has not started against this schema version, or not at all).
func (st *Store) Load(ctx context.Context, q schema.Querier, consumer string) (s Settings, ok bool, err error) {
	err = q.QueryRow(ctx, st.loadSQL, consumer).Scan(s.fields()...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Settings{Consumer: consumer}, false, nil
	case err != nil:
		return Settings{Consumer: consumer}, false, fmt.Errorf("recorded: read the settings of consumer %s: %w", consumer, err)
	}
	return s, true, nil
}

// Known reports whether the schema knows consumer: it has run, or claimed,
// there (its name is numbered in the consumers table).
func (st *Store) Known(ctx context.Context, q schema.Querier, consumer string) (bool, error) {
	var known bool
	if err := q.QueryRow(ctx, st.knownSQL, consumer).Scan(&known); err != nil {
		return false, fmt.Errorf("recorded: look consumer %s up: %w", consumer, err)
	}
	return known, nil
}

// List returns the settings of every consumer that recorded some, by name.
func (st *Store) List(ctx context.Context, q schema.Querier) ([]Settings, error) {
	rows, err := q.Query(ctx, st.listSQL)
	if err != nil {
		return nil, fmt.Errorf("recorded: list the consumers' settings: %w", err)
	}
	var out []Settings
	var s Settings
	// s is zeroed after each row, so that no row shares a slice with the next.
	if _, err := pgx.ForEachRow(rows, s.fields(), func() error { out = append(out, s); s = Settings{}; return nil }); err != nil {
		return nil, fmt.Errorf("recorded: list the consumers' settings: %w", err)
	}
	return out, nil
}

// fields are the columns loadSQL and listSQL read, in order.
func (s *Settings) fields() []any {
	return []any{&s.Consumer, &s.MessageIDRule, &s.GroupID, &s.Topics, &s.Brokers, &s.KafkaTLS, &s.KafkaSASL, &s.RecordedAt, &s.RecordedBy, &s.GroupType}
}
