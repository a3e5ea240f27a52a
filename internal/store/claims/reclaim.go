package claims

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/dedupe"
)

// Reclaim claims a message id again, for a redrive of a message that was set
// aside: a row of the id that is not applied and has the same fingerprint
// becomes applied; a missing row is inserted as applied. When the id is
// already applied, or claimed for different content, nothing changes and
// Reclaim returns false with the existing row.
func (s *Store) Reclaim(ctx context.Context, tx pgx.Tx, consumer, topic string, partition int, c Claim) (bool, dedupe.Record, error) {
	tag, err := tx.Exec(ctx, s.reclaimSQL, consumer, c.MessageID, c.Fingerprint[:])
	if err != nil {
		return false, dedupe.Record{}, fmt.Errorf("dedupe: reclaim: %w", err)
	}
	if tag.RowsAffected() == 1 {
		return true, dedupe.Record{}, nil
	}
	claimed, err := s.Claim(ctx, tx, consumer, topic, partition, []Claim{c})
	if err != nil {
		return false, dedupe.Record{}, err
	}
	if claimed[0] {
		return true, dedupe.Record{}, nil
	}
	existing, err := s.Lookup(ctx, tx, consumer, []string{c.MessageID})
	if err != nil {
		return false, dedupe.Record{}, err
	}
	return false, existing[c.MessageID], nil
}
