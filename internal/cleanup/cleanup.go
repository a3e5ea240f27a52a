// Package cleanup bounds the statements kafkaonce sends to end what it
// began: the ROLLBACK of a transaction that failed, was given up on, or
// is left behind at shutdown. They are sent whatever became of the
// caller's context (a shutdown cancels it, and a transaction must still
// end), so they need a bound of their own: a server that stops answering
// (hung on its storage, stopped, behind a network that drops packets
// while the TCP connection stays up) would otherwise hold the caller, and
// a shutdown, for ever.
package cleanup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Timeout bounds one statement that ends what kafkaonce began. A ROLLBACK
// takes the server a moment; one unanswered this long is from a server
// that is not answering, and closing the connection ends the transaction
// as surely (the server rolls back a session whose client went away).
const Timeout = 2 * time.Second

// Context is the context for such a statement: ctx's values, none of its
// cancellation, and Timeout.
func Context(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), Timeout)
}

// Rollback rolls tx back within Timeout, whatever became of ctx. When the
// server does not answer in time, it closes tx's network connection
// itself: pgx gives a connection whose reply timed out up to 15 seconds
// to hear from the server before closing it, and a server that is not
// answering never speaks, so the pool would wait that long for its slot
// and a caller closing the pool longer still. Closing it is safe: pgx
// has marked the connection broken already.
func Rollback(ctx context.Context, tx pgx.Tx) error {
	ctx, cancel := Context(ctx)
	defer cancel()
	err := tx.Rollback(ctx)
	if err != nil && ctx.Err() != nil {
		CloseConn(tx.Conn())
	}
	return err
}

// CloseConn closes c's network connection at once, without a word to the
// server (which rolls back the session's transaction when it notices).
func CloseConn(c *pgx.Conn) {
	if c == nil {
		return
	}
	if nc := c.PgConn().Conn(); nc != nil {
		_ = nc.Close()
	}
}
