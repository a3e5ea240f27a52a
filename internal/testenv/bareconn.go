package testenv

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BareConns remembers every connection a pool hands out, by its server
// session's pid, so that a test's handler can reach the connection under
// the guarded transaction it was given, which hands out none: as code
// that got hold of the connection some other way would, going around the
// guard to see what the database itself refuses.
type BareConns struct {
	mu    sync.Mutex
	byPID map[uint32]*pgx.Conn
}

// Option is the DBOption that makes the pool remember its connections.
func (b *BareConns) Option() DBOption {
	return func(c *pgxpool.Config) {
		c.PrepareConn = func(_ context.Context, conn *pgx.Conn) (bool, error) {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.byPID == nil {
				b.byPID = map[uint32]*pgx.Conn{}
			}
			b.byPID[conn.PgConn().PID()] = conn
			return true, nil
		}
	}
}

// Of returns the connection tx runs on, asking tx for its session's pid.
// It may be called from a handler's goroutine: it fails with an error.
func (b *BareConns) Of(ctx context.Context, tx pgx.Tx) (*pgx.Conn, error) {
	var pid uint32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return nil, fmt.Errorf("testenv: the transaction's session: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if conn := b.byPID[pid]; conn != nil {
		return conn, nil
	}
	return nil, fmt.Errorf("testenv: no connection of pid %d was handed out by a pool with BareConns.Option", pid)
}
