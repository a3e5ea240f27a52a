package dedupe

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Status is what became of a claimed message.
type Status = kafkaoncetype.ClaimStatus

// What became of a claimed message (see kafkaoncetype.ClaimStatus).
const (
	StatusApplied          = kafkaoncetype.StatusApplied
	StatusDeadLettered     = kafkaoncetype.StatusDeadLettered
	StatusInvalid          = kafkaoncetype.StatusInvalid
	StatusSuspectDuplicate = kafkaoncetype.StatusSuspectDuplicate
)

// Record is a row of processed_messages.
type Record = kafkaoncetype.Claim

// Store reads processed_messages in one schema, and prunes it.
type Store struct {
	table     string
	numbered  string
	suspects  string
	lookupSQL string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("dedupe: schema name %w", err)
	}
	t := schema.Table(schemaName, "processed_messages")
	// Rows name their consumer by number (the consumers table): numbered
	// looks the name in $1 up, once per statement.
	numbered := `(SELECT id FROM ` + schema.Table(schemaName, "consumers") + ` WHERE name = $1)`
	return &Store{
		table:    t,
		numbered: numbered,
		suspects: schema.Table(schemaName, "suspect_duplicates"),
		lookupSQL: `SELECT message_id, fingerprint, topic, partition, kafka_offset, status, attempts, processed_at
FROM ` + t + ` WHERE consumer_id = ` + numbered + ` AND message_id = ANY($2::text[])`,
	}, nil
}

// Lookup returns the stored rows for the given ids of a consumer, by id.
// Ids without a row are absent from the map.
func (s *Store) Lookup(ctx context.Context, q Querier, consumer string, ids []string) (map[string]Record, error) {
	// An unnamed statement, planned for these ids each time. The generic
	// plan Postgres settles on for a cached statement made while the table
	// was small seeks consumer only and filters message_id, reading every
	// row of the consumer, and it stays until the statistics change: a
	// lookup of a hundred ids then reads the consumer's whole table.
	rows, err := q.Query(ctx, s.lookupSQL, pgx.QueryExecModeExec, consumer, ids)
	if err != nil {
		return nil, fmt.Errorf("dedupe: lookup: %w", err)
	}
	out := make(map[string]Record, len(ids))
	var r Record
	var fp []byte
	_, err = pgx.ForEachRow(rows, []any{&r.MessageID, &fp, &r.Topic, &r.Partition, &r.Offset, &r.Status, &r.Attempts, &r.ProcessedAt}, func() error {
		r.Consumer = consumer
		copy(r.Fingerprint[:], fp)
		out[r.MessageID] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dedupe: lookup: %w", err)
	}
	return out, nil
}
