package positions

import (
	"fmt"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Store writes consumer_offsets in one schema.
type Store struct {
	advanceSQL string
	initSQL    string
	// initTopicSQL and topicStartedSQL are initSQL and a look for any
	// position, for a whole topic (see QueueInitTopic).
	initTopicSQL    string
	topicStartedSQL string
	loadSQL         string
	adoptTopicSQL   string
	passSQL         string
	lockSQL         string
	advanceFn       string
	// openFn and closeFn open and close a batch (see QueueOpen), and
	// openCheck is the constraint trigger that checks it at COMMIT.
	openFn, closeFn, openCheck string
	// afterUserCode checks the session once the handlers are done (see
	// QueueClose); asBegan and asHandler switch roles around the commit
	// check's lift (see CommitCheck).
	afterUserCode, asBegan, asHandler string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("offsets: schema name %w", err)
	}
	t := schema.Table(schemaName, "consumer_offsets")
	where := ` WHERE consumer = $1 AND topic = $2 AND partition = $3`
	load := `SELECT next_offset, topic_id FROM ` + t + where
	return &Store{
		// The WHERE keeps the position from moving backwards when a slower
		// member (a zombie from an older generation, say) commits a batch
		// after a newer member already went further.
		advanceSQL: `INSERT INTO ` + t + ` AS o (consumer, topic, partition, next_offset)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()
WHERE o.next_offset < EXCLUDED.next_offset`,
		initSQL: `INSERT INTO ` + t + ` (consumer, topic, partition, next_offset, topic_id) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (consumer, topic, partition) DO NOTHING`,
		initTopicSQL: `INSERT INTO ` + t + ` (consumer, topic, partition, next_offset, topic_id)
SELECT $1, $2, p - 1, s, $4 FROM unnest($3::bigint[]) WITH ORDINALITY AS u(s, p) WHERE s >= 0
ON CONFLICT (consumer, topic, partition) DO NOTHING`,
		adoptTopicSQL:   `UPDATE ` + t + ` SET topic_id = $4` + where + ` AND topic_id IS NULL`,
		topicStartedSQL: `SELECT EXISTS (SELECT FROM ` + t + ` WHERE consumer = $1 AND topic = $2)`,
		loadSQL:         load,
		passSQL: `UPDATE ` + t + ` SET next_offset = $5, updated_at = now()
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND next_offset = $4`,
		lockSQL:       `SELECT next_offset FROM ` + t + where + ` FOR UPDATE`,
		advanceFn:     schema.Table(schemaName, "advance_position"),
		openFn:        schema.Table(schemaName, "open_batch"),
		closeFn:       schema.Table(schemaName, "close_batch"),
		openCheck:     schema.Table(schemaName, "open_batches_closed_at_commit"),
		afterUserCode: schema.AfterUserCode(schemaName),
		asBegan:       schema.AsBegan(schemaName),
		asHandler:     schema.AsHandler(schemaName),
	}, nil
}
