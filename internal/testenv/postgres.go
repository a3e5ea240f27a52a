package testenv

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

var pg struct {
	sync.Once
	server *devenv.Postgres
	admin  *pgxpool.Pool
	err    error
}

// PostgresServer returns the test binary's Postgres server, starting it on
// first use.
func PostgresServer(tb testing.TB) *devenv.Postgres {
	tb.Helper()
	requireMain(tb)
	pg.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		pg.server, pg.err = devenv.StartPostgres(ctx, nil)
		if pg.err != nil {
			return
		}
		pg.admin, pg.err = pgxpool.New(ctx, pg.server.URL)
		if pg.err != nil {
			_ = pg.server.Close()
			return
		}
		atExit(func() {
			pg.admin.Close()
			_ = pg.server.Close()
		})
	})
	if pg.err != nil {
		tb.Fatalf("testenv: %v", pg.err)
	}
	return pg.server
}

// DB is one test's slice of the Postgres server: its own schema, holding
// kafkaonce's tables (unless created with NewEmptyDB) and the test's own.
type DB struct {
	// Pool connects with search_path set to the empty string, so any SQL that
	// forgets to qualify a table name fails in tests instead of finding a
	// table by accident.
	Pool *pgxpool.Pool
	// Schema is the test's schema, created empty or migrated.
	Schema string
	// URL is the server's connection string (no search_path override).
	URL string
}

// DBOption adjusts the test pool.
type DBOption func(*pgxpool.Config)

// MaxConns sets the pool size (default 8).
func MaxConns(n int32) DBOption { return func(c *pgxpool.Config) { c.MaxConns = n } }

// NewDB returns a pool and a fresh schema migrated to the latest version.
// The schema is dropped when the test ends.
func NewDB(tb testing.TB, opts ...DBOption) *DB {
	tb.Helper()
	db := NewEmptyDB(tb, opts...)
	if _, err := schema.Migrate(context.Background(), db.Pool, db.Schema); err != nil {
		tb.Fatalf("testenv: migrate: %v", err)
	}
	return db
}

// NewEmptyDB is NewDB without kafkaonce's tables.
func NewEmptyDB(tb testing.TB, opts ...DBOption) *DB {
	tb.Helper()
	server := PostgresServer(tb)
	ctx := context.Background()
	name := Name(tb, "t")
	if _, err := pg.admin.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("testenv: create schema: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(server.URL)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.MaxConns = 8
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() {
		pool.Close()
		_, _ = pg.admin.Exec(context.Background(), `DROP SCHEMA IF EXISTS `+pgx.Identifier{name}.Sanitize()+` CASCADE`)
	})
	return &DB{Pool: pool, Schema: name, URL: server.URL}
}

// AppURL is the server's connection string with the test's
// application_name, for child processes: their sessions count as the
// test's in pg_stat_activity.
func (d *DB) AppURL() string {
	sep := "?"
	if strings.Contains(d.URL, "?") {
		sep = "&"
	}
	return d.URL + sep + "application_name=" + d.Schema
}

// Sessions counts the test's server sessions in the given state ("idle in
// transaction", "active", ...), other than the one asking.
func (d *DB) Sessions(tb testing.TB, state string) int64 {
	tb.Helper()
	return d.Int(tb, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE $2 AND pid <> pg_backend_pid()`, d.Schema, state)
}

// SessionsStuck counts the test's server sessions that have been in the
// given state for longer than d, other than the one asking: a transaction
// held open, or a statement waiting, as against the short reads a
// consumer's background loops make each second.
func (d *DB) SessionsStuck(tb testing.TB, state string, longer time.Duration) int64 {
	tb.Helper()
	return d.Int(tb, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE $2 AND pid <> pg_backend_pid()
		AND state_change < clock_timestamp() - make_interval(secs => $3)`, d.Schema, state, longer.Seconds())
}

// LockWaits counts the statements on the test's table name (as Table
// quotes it) that wait for a lock: a test that holds a row waits on it
// for the statement it means to block, instead of sleeping.
func (d *DB) LockWaits(tb testing.TB, table string) int64 {
	tb.Helper()
	return d.Int(tb, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, d.Table(table))
}

// ConsumerIs is the condition on processed_messages that selects the rows
// of the consumer named by the SQL expression name (a parameter such as
// "$1", or a literal): rows name their consumer by number.
func (d *DB) ConsumerIs(name string) string {
	return "consumer_id = (SELECT id FROM " + d.Table("consumers") + " WHERE name = " + name + ")"
}

// Table returns the quoted name of a table in the test's schema.
func (d *DB) Table(name string) string { return schema.Table(d.Schema, name) }

// Exec runs SQL or fails the test.
func (d *DB) Exec(tb testing.TB, sql string, args ...any) {
	tb.Helper()
	if _, err := d.Pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("testenv: %s: %v", sql, err)
	}
}

// Int returns the single integer a query yields, or fails the test.
func (d *DB) Int(tb testing.TB, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := d.Pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("testenv: %s: %v", sql, err)
	}
	return n
}

// PoolVia returns a pool to the test's database that connects through
// hostport (a fault-injecting proxy) instead of the server's own address.
// Closed when the test ends.
func (d *DB) PoolVia(tb testing.TB, hostport string, opts ...DBOption) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	cfg.ConnConfig.Host = host
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Port = uint16(p)
	cfg.ConnConfig.Fallbacks = nil
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.ConnConfig.RuntimeParams["application_name"] = d.Schema
	cfg.MaxConns = 8
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// ServerAddr is the "host:port" of the Postgres server.
func (d *DB) ServerAddr(tb testing.TB) string {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(d.URL)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
}

// NewRole creates a role of the test's own that cannot log in, may use the
// names of the test's schema, and has the privileges given (each as GRANT
// takes them: "SELECT, INSERT ON <table>"); it is dropped, with what it
// owns, when the test ends.
func (d *DB) NewRole(tb testing.TB, privileges ...string) string {
	tb.Helper()
	role := Name(tb, "role")
	d.Exec(tb, `CREATE ROLE `+role+` NOLOGIN`)
	tb.Cleanup(func() { d.Exec(tb, `DROP OWNED BY `+role+`; DROP ROLE `+role) })
	d.Exec(tb, `GRANT USAGE ON SCHEMA `+pgx.Identifier{d.Schema}.Sanitize()+` TO `+role)
	for _, p := range privileges {
		d.Exec(tb, `GRANT `+p+` TO `+role)
	}
	return role
}
