package dedupe

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kafkaonce/kafkaonce/internal/pgarray"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Status is what became of a claimed message.
type Status string

const (
	// StatusApplied: the handler ran and its effects committed with the claim.
	StatusApplied Status = "applied"
	// StatusDeadLettered: the message failed and was set aside.
	StatusDeadLettered Status = "dead_lettered"
	// StatusInvalid: the message could not be processed at all (for example
	// its id could not be read).
	StatusInvalid Status = "invalid"
	// StatusSuspectDuplicate: the message's content was seen shortly before
	// under another id and the consumer was told to skip such messages.
	StatusSuspectDuplicate Status = "suspect_duplicate"
)

// Claim is one message id to claim, with where the message came from.
type Claim struct {
	MessageID   string
	Fingerprint Fingerprint
	Offset      int64
	// Status is StatusApplied when empty.
	Status Status
	// Attempts is 1 when zero.
	Attempts int
}

// Record is a row of processed_messages.
type Record struct {
	Consumer    string
	MessageID   string
	Fingerprint Fingerprint
	Topic       string
	Partition   int
	Offset      int64
	Status      Status
	Attempts    int
	ProcessedAt time.Time
}

// Store reads and writes processed_messages in one schema.
type Store struct {
	table         string
	numbered      string // the consumer number of the name in $1
	numberSQL     string
	suspects      string
	claimSQL      string
	claimPlainSQL string
	lookupSQL     string
	statusSQL     string
	claimNewSQL   string
	expectSQL     string

	// The plain claims again, with the claims packed into one parameter
	// (see packed.go): what a consumer sends for nearly every batch.
	claimPackedSQL    string
	claimNewPackedSQL string
}

// NewStore returns a Store for the tables in schemaName.
func NewStore(schemaName string) (*Store, error) {
	if err := schema.ValidateName(schemaName); err != nil {
		return nil, fmt.Errorf("dedupe: schema name %w", err)
	}
	t := schema.Table(schemaName, "processed_messages")
	// Rows name their consumer by number (migration 007): numbered looks
	// the name in $1 up, once per statement; numberOf numbers a name seen
	// for the first time too (a consumer numbers its name at start-up, but
	// claiming through a Store alone works as well).
	consumers := schema.Table(schemaName, "consumers")
	numbered := `(SELECT id FROM ` + consumers + ` WHERE name = $1)`
	numberOf := `(SELECT coalesce(` + numbered + `, ` + schema.Table(schemaName, "consumer_id") + `($1)))`
	// Rows are inserted in message-id order so that two transactions
	// claiming overlapping ids take their row locks in the same order and
	// cannot deadlock each other. The order is the bytes' (COLLATE "C"),
	// the primary key's since migration 007, whatever the database's
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
		table:     t,
		numbered:  numbered,
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
		lookupSQL: `SELECT message_id, fingerprint, topic, partition, kafka_offset, status, attempts, processed_at
FROM ` + t + ` WHERE consumer_id = ` + numbered + ` AND message_id = ANY($2::text[])`,
		statusSQL: `UPDATE ` + t + ` AS p SET status = $3, attempts = u.attempts
FROM unnest($2::text[], $4::int[]) AS u(message_id, attempts)
WHERE p.consumer_id = ` + numbered + ` AND p.message_id = u.message_id`,
	}, nil
}

// NumberConsumer numbers a consumer name in the consumers table (the rows
// of processed_messages name their consumer by that number) and returns its
// number; a name numbered before keeps its number. A consumer calls it at
// start-up and commits it at once, so that its claims only look the number
// up; a claim for a name never numbered numbers it in the claim's own
// transaction, which then holds the new name's row until it ends.
func (s *Store) NumberConsumer(ctx context.Context, q schema.Querier, consumer string) (int32, error) {
	var id int32
	if err := q.QueryRow(ctx, s.numberSQL, consumer).Scan(&id); err != nil {
		return 0, fmt.Errorf("dedupe: number consumer %q: %w", consumer, err)
	}
	return id, nil
}

// Table is the quoted, schema-qualified table name.
func (s *Store) Table() string { return s.table }

// QueueClaim adds the claim of a batch to b. When b's results are read,
// claimed[i] is set for every claims[i] that this transaction inserted; the
// others were already present (claimed by an earlier or concurrent
// transaction that committed). claims must be in ascending offset order, as
// a partition's messages are, with distinct message ids; claimed must have
// len(claims).
//
// Queueing instead of executing lets the caller send the claim in the same
// round trip as other statements.
func (s *Store) QueueClaim(b *pgx.Batch, consumer, topic string, partition int, claims []Claim, claimed []bool) {
	plain := true // every claim is a plain "applied" one, attempt 1
	for i := range claims {
		plain = plain && (claims[i].Status == "" || claims[i].Status == StatusApplied) && claims[i].Attempts <= 1
	}
	var q *pgx.QueuedQuery
	var packed *packedClaims
	if plain {
		// The common case leaves status and attempts to their defaults.
		q, packed = queuePlain(b, s.claimPackedSQL, s.claimPlainSQL, consumer, topic, partition, claims)
	} else {
		ids, fps, offsets := claimArrays(claims)
		statuses := make(pgarray.Array[pgarray.Text], len(claims))
		attempts := make([]int32, len(claims))
		for i := range claims {
			statuses[i] = pgarray.Text(StatusApplied)
			if claims[i].Status != "" {
				statuses[i] = pgarray.Text(claims[i].Status)
			}
			attempts[i] = int32(max(claims[i].Attempts, 1))
		}
		q = b.Queue(s.claimSQL, consumer, topic, partition, ids, fps, offsets, statuses, attempts)
	}
	q.Query(func(rows pgx.Rows) error {
		var off int64
		_, err := pgx.ForEachRow(rows, []any{&off}, func() error {
			i := indexOfOffset(claims, off)
			if i < 0 {
				return fmt.Errorf("dedupe: claim returned offset %d that was not in the batch", off)
			}
			claimed[i] = true
			return nil
		})
		return err
	})
	releaseAfter(q, packed)
}

// QueueClaimNew adds to b the claim of a batch expected to hold only new
// message ids: plain, "applied", first-attempt claims. If any id is already
// claimed (or appears twice in claims) the statement fails with a unique
// violation of the primary key, which stops a pipelined transaction before
// its COMMIT; the caller then claims the batch with QueueClaim, which sorts
// out which ids were new. *claimed is set to true when the statement
// succeeds.
func (s *Store) QueueClaimNew(b *pgx.Batch, consumer, topic string, partition int, claims []Claim, claimed *bool) {
	q, packed := queuePlain(b, s.claimNewPackedSQL, s.claimNewSQL, consumer, topic, partition, claims)
	q.Exec(func(pgconn.CommandTag) error { *claimed = true; return nil })
	releaseAfter(q, packed)
}

// ExpectFailed is the SQLSTATE of QueueExpectClaimed's statement when a
// message it names is not claimed with the given fingerprint.
const ExpectFailed = "KO002"

// QueueExpectClaimed adds to b a statement that fails with SQLSTATE
// ExpectFailed unless every ids[i] is claimed by consumer with fps[i]: the
// check for messages skipped as re-sent without claiming them. Like a
// failing claim, a failure stops a pipelined transaction before its COMMIT.
func (s *Store) QueueExpectClaimed(b *pgx.Batch, consumer string, ids []string, fps []Fingerprint) {
	idArr := make(pgarray.Array[pgarray.Text], len(ids))
	fpArr := make(pgarray.Array[pgarray.Bytes], len(fps))
	for i := range ids {
		idArr[i] = pgarray.Text(ids[i])
		fpArr[i] = fps[i][:]
	}
	b.Queue(s.expectSQL, consumer, idArr, fpArr)
}

// queuePlain queues a plain claim: packedSQL with the claims packed when
// they can be (the caller hands packed to releaseAfter once it has set the
// result callback), else arraySQL with them as arrays.
func queuePlain(b *pgx.Batch, packedSQL, arraySQL, consumer, topic string, partition int, claims []Claim) (*pgx.QueuedQuery, *packedClaims) {
	if packed, idsAt, offsetsAt, ok := packClaims(claims); ok {
		return b.Queue(packedSQL, consumer, topic, partition, packed.buf, idsAt, offsetsAt), packed
	}
	ids, fps, offsets := claimArrays(claims)
	return b.Queue(arraySQL, consumer, topic, partition, ids, fps, offsets), nil
}

// claimArrays are the array parameters of the claim statements.
func claimArrays(claims []Claim) (pgarray.Array[pgarray.Text], pgarray.Array[pgarray.Bytes], pgarray.Array[pgarray.Int8]) {
	ids := make(pgarray.Array[pgarray.Text], len(claims))
	fps := make(pgarray.Array[pgarray.Bytes], len(claims))
	offsets := make(pgarray.Array[pgarray.Int8], len(claims))
	for i := range claims {
		ids[i] = pgarray.Text(claims[i].MessageID)
		fps[i] = claims[i].Fingerprint[:]
		offsets[i] = pgarray.Int8(claims[i].Offset)
	}
	return ids, fps, offsets
}

// QueueSetStatus adds to b the change of status of claims this transaction
// made, for messages that failed after they were claimed. attempts[i] goes
// with ids[i].
func (s *Store) QueueSetStatus(b *pgx.Batch, consumer string, ids []string, attempts []int32, status Status) {
	b.Queue(s.statusSQL, consumer, ids, string(status), attempts)
}

// QueueUnclaim adds to b the removal of claims this transaction made for
// messages it will not process after all (the tail of a batch cut short).
func (s *Store) QueueUnclaim(b *pgx.Batch, consumer string, ids []string) {
	b.Queue(`DELETE FROM `+s.table+` WHERE consumer_id = `+s.numbered+` AND message_id = ANY($2::text[])`, consumer, ids)
}

// Claim runs QueueClaim's statement on its own and returns which claims were
// inserted.
func (s *Store) Claim(ctx context.Context, tx pgx.Tx, consumer, topic string, partition int, claims []Claim) ([]bool, error) {
	claimed := make([]bool, len(claims))
	b := &pgx.Batch{}
	s.QueueClaim(b, consumer, topic, partition, claims, claimed)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, fmt.Errorf("dedupe: claim: %w", err)
	}
	return claimed, nil
}

// Lookup returns the stored rows for the given ids of a consumer, by id.
// Ids without a row are absent from the map.
func (s *Store) Lookup(ctx context.Context, q schema.Querier, consumer string, ids []string) (map[string]Record, error) {
	// An unnamed statement, planned for these ids each time. The generic
	// plan Postgres settles on for a cached statement made while the table
	// was small seeks consumer only and filters message_id, reading every
	// row of the consumer, and it stays until the statistics change
	// (measured: lookups of about 100 ids in 200,000 rows took 250-570 ms).
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

// indexOfOffset finds off in claims, which are in ascending offset order as
// a partition's batch is.
func indexOfOffset(claims []Claim, off int64) int {
	lo, hi := 0, len(claims)
	for lo < hi {
		mid := (lo + hi) / 2
		switch {
		case claims[mid].Offset == off:
			return mid
		case claims[mid].Offset < off:
			lo = mid + 1
		default:
			hi = mid
		}
	}
	return -1
}

// Reclaim claims a message id again, for a redrive of a message that was set
// aside: a row of the id that is not applied and has the same fingerprint
// becomes applied; a missing row is inserted as applied. When the id is
// already applied, or claimed for different content, nothing changes and
// Reclaim returns false with the existing row.
func (s *Store) Reclaim(ctx context.Context, tx pgx.Tx, consumer, topic string, partition int, c Claim) (bool, Record, error) {
	tag, err := tx.Exec(ctx, `UPDATE `+s.table+` SET status = 'applied', processed_at = now()
WHERE consumer_id = `+s.numbered+` AND message_id = $2 AND status <> 'applied' AND fingerprint = $3`, consumer, c.MessageID, c.Fingerprint[:])
	if err != nil {
		return false, Record{}, fmt.Errorf("dedupe: reclaim: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, Record{}, nil
	}
	claimed, err := s.Claim(ctx, tx, consumer, topic, partition, []Claim{c})
	if err != nil {
		return false, Record{}, err
	}
	if claimed[0] {
		return true, Record{}, nil
	}
	existing, err := s.Lookup(ctx, tx, consumer, []string{c.MessageID})
	if err != nil {
		return false, Record{}, err
	}
	return false, existing[c.MessageID], nil
}
