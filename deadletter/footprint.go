package deadletter

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/dedupe"
)

// Footprint is where a letter's message was in its partition and what it
// held: its offset and the fingerprint of its key and value
// (dedupe.FingerprintOf). A message read from the log has a letter when
// both match: after a topic is re-created and its positions reset, a letter
// of an old message may sit at the offset of a new one.
type Footprint struct {
	Offset      int64
	Fingerprint dedupe.Fingerprint
}

// Footprints returns the footprints of a consumer's letters of one
// partition at offsets from first to last (both included), in no
// particular order.
func (s *Store) Footprints(ctx context.Context, q Querier, consumer, topic string, partition int, first, last int64) ([]Footprint, error) {
	rows, err := q.Query(ctx, `SELECT kafka_offset, fingerprint FROM `+s.table+`
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND kafka_offset BETWEEN $4 AND $5`,
		consumer, topic, partition, first, last)
	if err != nil {
		return nil, fmt.Errorf("deadletter: footprints: %w", err)
	}
	var out []Footprint
	var f Footprint
	var fp []byte
	_, err = pgx.ForEachRow(rows, []any{&f.Offset, &fp}, func() error {
		copy(f.Fingerprint[:], fp)
		out = append(out, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("deadletter: footprints: %w", err)
	}
	return out, nil
}
