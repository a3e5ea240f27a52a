package dedupe

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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

// Suspects lists a consumer's most recent suspects, newest first.
func (s *Store) Suspects(ctx context.Context, q Querier, consumer string, limit int) ([]Suspect, error) {
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
func (s *Store) CountSuspects(ctx context.Context, q Querier, consumer string) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, `SELECT count(*) FROM `+s.suspects+` WHERE consumer = $1`, consumer).Scan(&n); err != nil {
		return 0, fmt.Errorf("dedupe: count suspects: %w", err)
	}
	return n, nil
}
