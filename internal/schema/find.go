package schema

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Find returns the schemas of the database that hold kafkaonce's tables,
// in name order, for tools that are not told which to read. A schema
// counts when Migrate could have made it: its schema_migrations table has
// Migrate's columns (version, name, applied_at; other tools' tables of that
// name do not) and it holds consumer_offsets, which the first migration
// creates. Names ValidateName refuses are left out: Migrate never makes
// tables there.
func Find(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT n.nspname::text
FROM pg_namespace AS n
WHERE EXISTS (SELECT 1 FROM pg_class AS c
              WHERE c.relnamespace = n.oid AND c.relname = 'consumer_offsets' AND c.relkind IN ('r', 'p'))
  AND (SELECT count(*) FROM pg_class AS c JOIN pg_attribute AS a ON a.attrelid = c.oid
       WHERE c.relnamespace = n.oid AND c.relname = 'schema_migrations' AND c.relkind = 'r'
         AND a.attname IN ('version', 'name', 'applied_at') AND NOT a.attisdropped) = 3
ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("schema: find kafkaonce's schemas: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("schema: find kafkaonce's schemas: %w", err)
	}
	out := names[:0]
	for _, n := range names {
		if ValidateName(n) == nil {
			out = append(out, n)
		}
	}
	return out, nil
}
