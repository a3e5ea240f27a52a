package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// stillInProgress reports whether err, from a statement that waited for
// a key (its advisory lock, a run's row), means that another request with
// the key is still running: the wait ran out. That is a lock_timeout
// (55P03, lock_not_available: InProgressWait, or a takeover's lease) or a
// statement_timeout (57014, query_canceled) shorter than the wait, which
// the role's settings may impose; not a cancel because the request's own
// context ended (its client is gone; nothing is answered to it anyway).
func stillInProgress(ctx context.Context, err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "55P03":
		return true
	case "57014":
		return ctx.Err() == nil
	}
	return false
}

// inProgressWait is a request's wait, up to Config.InProgressWait, for a
// phased run with its key to complete. A run spans transactions, so there
// is no lock to wait on: the request looks at the key's row again after
// pauses that grow from firstLook to everyLook.
type inProgressWait struct {
	until time.Time
	next  time.Duration
}

const (
	firstLook = 10 * time.Millisecond
	everyLook = 250 * time.Millisecond
)

func (s *Server) newWait() *inProgressWait {
	return &inProgressWait{until: time.Now().Add(s.cfg.InProgressWait), next: firstLook}
}

// lockWait is how long the next look may wait for the key's lock: what
// is left of the wait (at least a millisecond, since a lock_timeout of 0
// waits for ever), or 0, no wait, without InProgressWait.
func (w *inProgressWait) lockWait(configured time.Duration) time.Duration {
	if configured <= 0 {
		return 0
	}
	return max(time.Until(w.until), time.Millisecond)
}

// pause waits before the next look, and reports false, at once, when the
// wait is over or ctx ended.
func (w *inProgressWait) pause(ctx context.Context) bool {
	left := time.Until(w.until)
	if left <= 0 || ctx.Err() != nil {
		return false
	}
	d := min(w.next, left)
	w.next = min(2*w.next, everyLook)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
