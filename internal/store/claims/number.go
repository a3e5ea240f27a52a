package claims

import (
	"context"
	"fmt"

	"github.com/kafkaonce/kafkaonce/internal/schema"
)

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
