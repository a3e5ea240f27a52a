package letters

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/deadletter"
)

// Footprint is a letter's footprint (see deadletter.Footprint), and
// whether the letter is provisional: written before a share group
// record's last delivery, and not removed (see QueueInsertProvisional).
type Footprint struct {
	deadletter.Footprint
	Provisional bool
}

// FootprintsMarked is deadletter.Store.Footprints with each letter's
// provisional mark, for the audit of a share group: a provisional letter
// of a record the broker settled is the letter of a last delivery that
// never finished, while one of a record still in flight stands for a
// delivery under way.
func (s *Store) FootprintsMarked(ctx context.Context, q deadletter.Querier, consumer, topic string, partition int, first, last int64) ([]Footprint, error) {
	rows, err := q.Query(ctx, `SELECT kafka_offset, fingerprint, provisional FROM `+s.table+`
WHERE consumer = $1 AND topic = $2 AND partition = $3 AND kafka_offset BETWEEN $4 AND $5`,
		consumer, topic, partition, first, last)
	if err != nil {
		return nil, fmt.Errorf("deadletter: footprints: %w", err)
	}
	var out []Footprint
	var f Footprint
	var fp []byte
	_, err = pgx.ForEachRow(rows, []any{&f.Offset, &fp, &f.Provisional}, func() error {
		copy(f.Fingerprint[:], fp)
		out = append(out, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("deadletter: footprints: %w", err)
	}
	return out, nil
}
