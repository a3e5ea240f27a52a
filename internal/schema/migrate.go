package schema

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one numbered step of the schema.
type Migration struct {
	Version int
	Name    string
	sql     string
}

// migrations is parsed once from the embedded files; a malformed file name is
// a build-time mistake, caught by the package tests.
var migrations = mustLoad(migrationFiles)

// Migrations returns the embedded migration set in version order.
func Migrations() []Migration { return append([]Migration(nil), migrations...) }

// LatestVersion is the version the embedded migration set brings a schema to.
func LatestVersion() int { return migrations[len(migrations)-1].Version }

func mustLoad(fsys fs.FS) []Migration {
	ms, err := load(fsys)
	if err != nil {
		panic(err)
	}
	return ms
}

// load reads files named NNN_name.sql. Versions must start at 1 and have no
// gaps, so that "version N" always means the same set of tables.
func load(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, e := range entries {
		base, ok := strings.CutSuffix(e.Name(), ".sql")
		if !ok {
			continue
		}
		num, name, ok := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("schema: migration file %q must be named NNN_name.sql", e.Name())
		}
		body, err := fs.ReadFile(fsys, "migrations/"+e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: version, Name: name, sql: string(body)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("schema: migration versions must run 1, 2, 3, ... without gaps (found %d at position %d)", m.Version, i+1)
		}
	}
	if len(ms) == 0 {
		return nil, errors.New("schema: no migrations embedded")
	}
	return ms, nil
}

// Beginner starts transactions; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Querier runs statements; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
// It is kafkaoncetype's, so that a Pruner's Step takes what the engine's
// transactions give.
type Querier = kafkaoncetype.Querier

// Migrate brings the schema named schemaName to LatestVersion and returns
// that version. It runs in one transaction under an advisory lock keyed on the
// schema name, so any number of workers may call it at start-up at once: the
// first applies the missing steps, the others wait and then find nothing to
// do. A schema at a newer version than this library knows is an error: an
// older binary must not run against tables it does not understand.
func Migrate(ctx context.Context, db Beginner, schemaName string) (int, error) {
	return migrateTo(ctx, db, schemaName, LatestVersion())
}

// migrateTo is Migrate stopping at version target (tests upgrade a schema
// made by an older release this way).
func migrateTo(ctx context.Context, db Beginner, schemaName string, target int) (int, error) {
	if err := ValidateName(schemaName); err != nil {
		return 0, fmt.Errorf("schema: name %w", err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("schema: begin migration: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()

	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('kafkaonce.migrate:' || $1, 0))`, schemaName); err != nil {
		return 0, fmt.Errorf("schema: take migration lock: %w", err)
	}
	ident := pgx.Identifier{schemaName}.Sanitize()
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+ident); err != nil {
		return 0, fmt.Errorf("schema: create schema %s: %w", ident, err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+Table(schemaName, "schema_migrations")+` (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return 0, fmt.Errorf("schema: create schema_migrations: %w", err)
	}
	current, err := Version(ctx, tx, schemaName)
	if err != nil {
		return 0, err
	}
	if latest := LatestVersion(); current > latest {
		return 0, fmt.Errorf("schema: %s is at version %d, newer than the %d this kafkaonce build knows; upgrade kafkaonce", ident, current, latest)
	}
	for _, m := range migrations {
		if m.Version <= current || m.Version > target {
			continue
		}
		sql := strings.ReplaceAll(m.sql, "{{schema}}", ident)
		if _, err := tx.Exec(ctx, sql); err != nil {
			return 0, fmt.Errorf("schema: apply migration %03d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+Table(schemaName, "schema_migrations")+` (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
			return 0, fmt.Errorf("schema: record migration %03d_%s: %w", m.Version, m.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("schema: commit migration: %w", err)
	}
	return max(current, target), nil
}

// Version returns the highest migration applied to the schema, or 0 when the
// schema or its schema_migrations table does not exist yet.
func Version(ctx context.Context, q Querier, schemaName string) (int, error) {
	if err := ValidateName(schemaName); err != nil {
		return 0, fmt.Errorf("schema: name %w", err)
	}
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, Table(schemaName, "schema_migrations")).Scan(&exists); err != nil {
		return 0, fmt.Errorf("schema: read version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := q.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM `+Table(schemaName, "schema_migrations")).Scan(&v); err != nil {
		return 0, fmt.Errorf("schema: read version: %w", err)
	}
	return v, nil
}

// RequireLatest returns a descriptive error unless the schema is exactly at
// LatestVersion. Workers call it before consuming so that a forgotten
// migration fails at start-up, not on the first message.
func RequireLatest(ctx context.Context, q Querier, schemaName string) error {
	v, err := Version(ctx, q, schemaName)
	if err != nil {
		return err
	}
	switch latest := LatestVersion(); {
	case v == latest:
		return nil
	case v < latest:
		return fmt.Errorf("schema %q is at version %d but this kafkaonce needs %d: run consumer.Migrate (or `kafkaonce migrate`) first", schemaName, v, latest)
	default:
		return fmt.Errorf("schema %q is at version %d, newer than the %d this kafkaonce build knows: upgrade kafkaonce", schemaName, v, latest)
	}
}
