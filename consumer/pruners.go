package consumer

import (
	"context"

	"github.com/kafkaonce/kafkaonce/idempotency"
	"github.com/kafkaonce/kafkaonce/internal/maintenance"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// pruners are the tables beside its own that a consumer prunes with
// Config.Prune: the expired keys of the HTTP front door (package
// idempotency), which any process of the schema may have stored, so that
// an API needs no pruning loop of its own.
func pruners(schemaName string) ([]maintenance.Pruner, error) {
	keys, err := idempotency.NewStore(schemaName)
	if err != nil {
		return nil, err
	}
	return []maintenance.Pruner{{
		Table: "expired idempotency_keys",
		Step: func(ctx context.Context, q schema.Querier, limit int) (int64, error) {
			return keys.Prune(ctx, q, limit)
		},
	}}, nil
}
