package schema

import (
	"context"
	"fmt"
)

// StoreID returns the id of the store that the schema named schemaName is:
// the random id migration 019 made once in store_identity. A restore of the
// database from a backup brings the same id back, while a schema migrated
// anew gets another, so the consumer's offset commits name it to tell a
// group offset committed against this store, whose position row is gone,
// from one committed against another (see internal/commitmark).
func StoreID(ctx context.Context, q Querier, schemaName string) (string, error) {
	var id string
	err := q.QueryRow(ctx, `SELECT id::text FROM `+Table(schemaName, "store_identity")).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("schema: read the store's id from %s (made by migration 019; a restore must bring the row back with the rest): %w",
			Table(schemaName, "store_identity"), err)
	}
	return id, nil
}
