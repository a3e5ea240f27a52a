package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// rollbackBound bounds the ROLLBACK a command sends when it leaves a
// transaction it did not commit. The library bounds its own the same way
// (its internal cleanup package); the CLI keeps these few lines rather
// than import that package across the module boundary, where a change to
// it would reach the CLI unversioned.
const rollbackBound = 2 * time.Second

// rollback rolls tx back within rollbackBound, whatever became of ctx: a
// Ctrl-C cancels ctx, and the transaction must still end. A server that
// does not answer in time gets its connection closed under it (it rolls
// back a session whose client went away), so that closing the pool does
// not wait on a connection pgx has already marked broken.
func rollback(ctx context.Context, tx pgx.Tx) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackBound)
	defer cancel()
	if err := tx.Rollback(ctx); err == nil || ctx.Err() == nil || tx.Conn() == nil {
		return
	}
	if nc := tx.Conn().PgConn().Conn(); nc != nil {
		_ = nc.Close()
	}
}
