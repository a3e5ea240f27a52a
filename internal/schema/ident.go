// Package schema owns kafkaonce's tables: the embedded, numbered migration
// set, the function that applies it, and the rules for the schema name the
// tables live in.
package schema

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// DefaultName is the Postgres schema kafkaonce creates its tables in when the
// user names none. A dedicated schema keeps our table names
// (processed_messages, consumer_offsets, ...) from colliding with the user's.
const DefaultName = kafkaoncetype.DefaultSchema

// maxIdentifierLen is Postgres's NAMEDATALEN-1: longer names are silently
// truncated by the server, which would make two configured names collide.
const maxIdentifierLen = 63

// ValidateName reports whether name can be used as the schema that holds
// kafkaonce's tables. Only lower-case ASCII letters, digits and underscores
// are accepted, starting with a letter or underscore: such names mean the
// same thing quoted or unquoted, so an operator typing them into psql finds
// the same tables the library uses. The name is still quoted everywhere it
// reaches SQL.
func ValidateName(name string) error {
	if name == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(name) > maxIdentifierLen {
		return fmt.Errorf("must be at most %d bytes (got %d)", maxIdentifierLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return fmt.Errorf("must match [a-z_][a-z0-9_]* (got %q; use lower case letters, digits and underscores)", name)
		}
	}
	if len(name) >= 3 && name[:3] == "pg_" {
		return fmt.Errorf("must not start with pg_, which Postgres reserves (got %q)", name)
	}
	return nil
}

// Table returns the quoted, schema-qualified name of a table, ready to be
// placed into SQL text. schemaName must have passed ValidateName.
func Table(schemaName, table string) string {
	return pgx.Identifier{schemaName, table}.Sanitize()
}
