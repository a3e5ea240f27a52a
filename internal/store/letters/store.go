package letters

import (
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Store writes dead_letters in one schema. It is the deadletter.Store of
// the same schema, whose reads (List, Get) the consumer uses too, with the
// statements that set messages aside and record what became of them.
type Store struct {
	*deadletter.Store

	table          string
	insertSQL      string
	provisionalSQL string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	ops, err := deadletter.NewStore(schemaName) // checks the name
	if err != nil {
		return nil, err
	}
	t := schema.Table(schemaName, "dead_letters")
	return &Store{
		Store: ops,
		table: t,
		// The same message may be set aside twice (a batch run again after
		// an unknown COMMIT outcome, two members racing on a partition);
		// the first letter stands. A letter is unique per message, not per
		// offset (see migration 008): after a topic is re-created and its
		// positions reset, another message at the offset of an old letter
		// gets a letter of its own.
		insertSQL: `INSERT INTO ` + t + ` (consumer, topic, partition, kafka_offset, message_id, message_key, message_value,
	headers, message_time, error_class, error, attempts, first_failed_at, last_failed_at, retry_at)
SELECT $1, $2, $3, l.kafka_offset, l.message_id, l.message_key, l.message_value, l.headers, l.message_time,
	l.error_class, l.error, l.attempts, l.first_failed_at, l.last_failed_at, l.retry_at
FROM unnest($4::bigint[], $5::text[], $6::bytea[], $7::bytea[], $8::jsonb[], $9::timestamptz[], $10::text[], $11::text[],
	$12::int[], $13::timestamptz[], $14::timestamptz[], $15::timestamptz[])
	AS l(kafka_offset, message_id, message_key, message_value, headers, message_time, error_class, error, attempts, first_failed_at, last_failed_at, retry_at)
ON CONFLICT (consumer, topic, partition, kafka_offset, fingerprint, (coalesce(message_id, '')), (coalesce(message_time, '-infinity'::timestamptz)))
DO NOTHING`,
		// A provisional letter (see QueueInsertProvisional) is the same
		// insert, marked.
		provisionalSQL: `INSERT INTO ` + t + ` (consumer, topic, partition, kafka_offset, message_id, message_key, message_value,
	headers, message_time, error_class, error, attempts, first_failed_at, last_failed_at, retry_at, provisional)
SELECT $1, $2, $3, l.kafka_offset, l.message_id, l.message_key, l.message_value, l.headers, l.message_time,
	l.error_class, l.error, l.attempts, l.first_failed_at, l.last_failed_at, l.retry_at, true
FROM unnest($4::bigint[], $5::text[], $6::bytea[], $7::bytea[], $8::jsonb[], $9::timestamptz[], $10::text[], $11::text[],
	$12::int[], $13::timestamptz[], $14::timestamptz[], $15::timestamptz[])
	AS l(kafka_offset, message_id, message_key, message_value, headers, message_time, error_class, error, attempts, first_failed_at, last_failed_at, retry_at)
ON CONFLICT (consumer, topic, partition, kafka_offset, fingerprint, (coalesce(message_id, '')), (coalesce(message_time, '-infinity'::timestamptz)))
DO NOTHING`,
	}, nil
}
