package dedupe

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// Suspect is a message whose content was seen shortly before under another
// id: a likely producer duplicate that id deduplication cannot recognise.
type Suspect struct {
	Topic          string
	Partition      int
	Offset         int64
	MessageID      string
	Fingerprint    Fingerprint
	FirstMessageID string
	FirstOffset    int64
	// Skipped is true when the consumer treated it as a duplicate (did not
	// run the handler); false when it only reported it.
	Skipped    bool
	DetectedAt time.Time
}

// QueueSuspects adds to b the recording of suspects of one partition.
func (s *Store) QueueSuspects(b *pgx.Batch, consumer, topic string, partition int, suspects []Suspect) {
	n := len(suspects)
	offsets, ids, firstIDs, firstOffsets := make([]int64, n), make([]string, n), make([]string, n), make([]int64, n)
	fps, skipped := make([][]byte, n), make([]bool, n)
	for i := range suspects {
		offsets[i], ids[i], firstIDs[i], firstOffsets[i] = suspects[i].Offset, suspects[i].MessageID, suspects[i].FirstMessageID, suspects[i].FirstOffset
		fps[i], skipped[i] = suspects[i].Fingerprint[:], suspects[i].Skipped
	}
	b.Queue(`INSERT INTO `+s.suspects+` (consumer, topic, partition, kafka_offset, message_id, fingerprint, first_message_id, first_offset, skipped)
SELECT $1, $2, $3, u.o, u.id, u.fp, u.fid, u.fo, u.sk FROM unnest($4::bigint[], $5::text[], $6::bytea[], $7::text[], $8::bigint[], $9::bool[]) AS u(o, id, fp, fid, fo, sk)
ON CONFLICT DO NOTHING`, consumer, topic, partition, offsets, ids, fps, firstIDs, firstOffsets, skipped)
}

// Suspects lists a consumer's most recent suspects, newest first.
func (s *Store) Suspects(ctx context.Context, q schema.Querier, consumer string, limit int) ([]Suspect, error) {
	rows, err := q.Query(ctx, `SELECT topic, partition, kafka_offset, message_id, fingerprint, first_message_id, first_offset, skipped, detected_at
FROM `+s.suspects+` WHERE consumer = $1 ORDER BY detected_at DESC, topic, partition, kafka_offset LIMIT $2`, consumer, limit)
	if err != nil {
		return nil, fmt.Errorf("dedupe: suspects: %w", err)
	}
	var out []Suspect
	var sp Suspect
	var fp []byte
	_, err = pgx.ForEachRow(rows, []any{&sp.Topic, &sp.Partition, &sp.Offset, &sp.MessageID, &fp, &sp.FirstMessageID, &sp.FirstOffset, &sp.Skipped, &sp.DetectedAt}, func() error {
		copy(sp.Fingerprint[:], fp)
		out = append(out, sp)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dedupe: suspects: %w", err)
	}
	return out, nil
}

// CountSuspects counts a consumer's recorded suspects.
func (s *Store) CountSuspects(ctx context.Context, q schema.Querier, consumer string) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM `+s.suspects+` WHERE consumer = $1`, consumer).Scan(&n); err != nil {
		return 0, fmt.Errorf("dedupe: count suspects: %w", err)
	}
	return n, nil
}
