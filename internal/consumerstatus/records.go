package consumerstatus

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
)

// Records returns what every consumer of the schema recorded (nothing in a
// schema older than the record).
func Records(ctx context.Context, pool *pgxpool.Pool, schemaName string) ([]recorded.Settings, error) {
	v, err := schema.Version(ctx, pool, schemaName)
	if err != nil || v < schema.LatestVersion() {
		return nil, err
	}
	store, err := recorded.NewStore(schemaName)
	if err != nil {
		return nil, fmt.Errorf("schema %w", err)
	}
	return store.List(ctx, pool)
}

// GroupOf is a consumer's group: the one given (a flag, an option), else
// the recorded one, else the consumer's name (Config.GroupID's default).
func GroupOf(given string, rec *recorded.Settings, consumerName string) string {
	switch {
	case given != "":
		return given
	case rec != nil:
		return rec.GroupID
	}
	return consumerName
}
