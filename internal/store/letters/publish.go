package letters

import (
	"context"
	"fmt"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// MarkPublished records that letters were published to the dead-letter
// topic.
func (s *Store) MarkPublished(ctx context.Context, q schema.Querier, ids []int64) error {
	if _, err := q.Exec(ctx, `UPDATE `+s.table+` SET published_at = now() WHERE id = ANY($1) AND published_at IS NULL`, ids); err != nil {
		return fmt.Errorf("deadletter: mark published: %w", err)
	}
	return nil
}
