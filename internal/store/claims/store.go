package claims

import (
	"github.com/kafkaonce/kafkaonce/dedupe"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Store writes processed_messages in one schema. It is the dedupe.Store of
// the same schema, whose reads (Lookup) and pruning the engine uses too,
// with the statements that claim.
type Store struct {
	*dedupe.Store

	numberSQL     string
	suspects      string
	claimSQL      string
	claimPlainSQL string
	statusSQL     string
	unclaimSQL    string
	reclaimSQL    string
	claimNewSQL   string
	expectSQL     string

	// The plain claims again, with the claims packed into one parameter
	// (see packed.go): what a consumer sends for nearly every batch.
	claimPackedSQL    string
	claimNewPackedSQL string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	ops, err := dedupe.NewStore(schemaName) // checks the name
	if err != nil {
		return nil, err
	}
	t := schema.Table(schemaName, "processed_messages")
	// Rows name their consumer by number (the consumers table): numbered
	// looks the name in $1 up, once per statement; numberOf numbers a name seen
	// for the first time too (a consumer numbers its name at start-up, but
	// claiming through a Store alone works as well).
	numbered := `(SELECT id FROM ` + schema.Table(schemaName, "consumers") + ` WHERE name = $1)`
	numberOf := `(SELECT coalesce(` + numbered + `, ` + schema.Table(schemaName, "consumer_id") + `($1)))`
	// Rows are inserted in message-id order so that two transactions
	// claiming overlapping ids take their row locks in the same order and
	// cannot deadlock each other. The order is the bytes' (COLLATE "C"),
	// the primary key's, whatever the database's
	// collation: no locale comparisons in the sort either. Without ON
	// CONFLICT, a message id that is already there fails the statement
	// (see QueueClaimNew).
	insertPlain := `INSERT INTO ` + t + ` (consumer_id, message_id, fingerprint, topic, partition, kafka_offset)
`
	claimNew := insertPlain + `SELECT ` + numberOf + `, c.message_id, c.fingerprint, $2, $3, c.kafka_offset
FROM unnest($4::text[], $5::bytea[], $6::bigint[]) AS c(message_id, fingerprint, kafka_offset)
ORDER BY c.message_id COLLATE "C", c.kafka_offset`
	// RETURNING the offset (not the id) lets the caller map results back
	// without comparing strings.
	const skipTaken = `
ON CONFLICT (consumer_id, message_id) DO NOTHING
RETURNING kafka_offset`
	return &Store{
		Store:     ops,
		numberSQL: `SELECT ` + schema.Table(schemaName, "consumer_id") + `($1)`,
		suspects:  schema.Table(schemaName, "suspect_duplicates"),
		claimSQL: `INSERT INTO ` + t + ` (consumer_id, message_id, fingerprint, topic, partition, kafka_offset, status, attempts)
SELECT ` + numberOf + `, c.message_id, c.fingerprint, $2, $3, c.kafka_offset, c.status, c.attempts
FROM unnest($4::text[], $5::bytea[], $6::bigint[], $7::text[], $8::int[]) AS c(message_id, fingerprint, kafka_offset, status, attempts)
ORDER BY c.message_id COLLATE "C", c.kafka_offset` + skipTaken,
		claimPlainSQL:     claimNew + skipTaken,
		claimNewSQL:       claimNew,
		claimPackedSQL:    insertPlain + packedSelect(numberOf) + skipTaken,
		claimNewPackedSQL: insertPlain + packedSelect(numberOf),
		expectSQL:         `SELECT ` + schema.Table(schemaName, "expect_claimed") + `($1, $2, $3)`,
		statusSQL: `UPDATE ` + t + ` AS p SET status = $3, attempts = u.attempts
FROM unnest($2::text[], $4::int[]) AS u(message_id, attempts)
WHERE p.consumer_id = ` + numbered + ` AND p.message_id = u.message_id`,
		unclaimSQL: `DELETE FROM ` + t + ` WHERE consumer_id = ` + numbered + ` AND message_id = ANY($2::text[])`,
		reclaimSQL: `UPDATE ` + t + ` SET status = 'applied', processed_at = now()
WHERE consumer_id = ` + numbered + ` AND message_id = $2 AND status <> 'applied' AND fingerprint = $3`,
	}, nil
}
