package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kafkaonce/kafkaonce/internal/cleanup"
	"github.com/kafkaonce/kafkaonce/internal/pace"
	"github.com/kafkaonce/kafkaonce/internal/pipetx"
	"github.com/kafkaonce/kafkaonce/internal/schema"
	"github.com/kafkaonce/kafkaonce/internal/store/positions"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// batchTx is one batch transaction.
type batchTx struct {
	tx   pgx.Tx        // what statements (and the handler) run on
	pool *pgxpool.Conn // the lent connection; nil once cut loose
	done bool
	// hijacked is set once an abandoned attempt's connection was taken
	// out of the pool (see cutLoose): closing it is then ours to do.
	hijacked bool
}

// cutLoose lets go of the transaction of an abandoned attempt (see
// usercall.Attempt.Hold): it takes the connection out of the pool, so the
// pool has its slot back at once rather than when the hung handler
// returns, and closes its network connection, so that the server rolls
// the transaction back and releases its locks. The handler may still be
// using the connection: closing a net.Conn is safe from any goroutine.
func (t *batchTx) cutLoose() {
	netConn := t.netConn()
	if t.pool != nil {
		t.pool.Hijack()
		t.pool, t.hijacked = nil, true
	}
	_ = netConn.Close()
}

// begin begins the attempt's transaction with b. A serialized one first
// waits for the consumer's gate, in a round trip of its own, before it
// locks anything; gated is when it got through (the gate is held from
// then until the transaction ends).
func (a *txAttempt) begin(ctx context.Context, b *pgx.Batch) (bt *batchTx, gated time.Time, err error) {
	if !a.serialized {
		sess := a.session()
		if a.racing {
			sess = sess.racing
		}
		bt, err = a.beginIn(ctx, sess, b)
		return bt, time.Now(), err
	}
	gate := &pgx.Batch{}
	var before timeouts
	a.queueGate(gate, &before)
	if bt, err = a.beginWith(ctx, gate); err != nil {
		if isContention(err) {
			err = &gateBusyError{err: err}
		}
		return nil, time.Time{}, err
	}
	gated = time.Now()
	if err = bt.tx.SendBatch(ctx, afterGate(b, &before)).Close(); err != nil {
		bt.rollback(ctx)
		return nil, time.Time{}, err
	}
	return bt, gated, nil
}

// database is where the consumer's transactions run: the pool, the
// session settings every transaction begins with, and the consumer's gate.
// It is all of the consumer that a batch's transaction begins and ends
// with (see txDeps).
type database struct {
	db DB
	// positions writes the one-trip head's checked advance of the
	// position (see newSession).
	positions *positions.Store
	// gate says when the consumer's transactions take its gate, an
	// advisory lock keyed gateKey (see contention.go).
	gate    *pace.Gate
	gateKey int32
	// sess holds the session settings every transaction starts with. Run
	// replaces it once it knows the server's version, while Redrive may
	// already be reading it from another goroutine.
	sess atomic.Pointer[session]
}

// beginWith begins a transaction, applies the session settings and runs b
// in it, in one round trip: BEGIN travels with the batch's first
// statements.
func (c *database) beginWith(ctx context.Context, b *pgx.Batch) (*batchTx, error) {
	return c.beginIn(ctx, c.session(), b)
}

// beginIn is beginWith with the given session settings.
func (c *database) beginIn(ctx context.Context, sess *session, b *pgx.Batch) (*batchTx, error) {
	first := &pgx.Batch{}
	sess.queue(first)
	b = &pgx.Batch{QueuedQueries: append(first.QueuedQueries, b.QueuedQueries...)}
	t, err := c.acquire(ctx)
	if err != nil {
		return nil, err
	}
	var full pgx.Batch
	queueBegin(&full)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	if err := t.pool.SendBatch(ctx, &full).Close(); err != nil {
		t.rollback(ctx)
		return nil, err
	}
	return t, nil
}

// acquire takes a connection from the pool for a batch transaction, which
// its first round trip begins: beginIn's, or the whole of a one-trip
// batch's, which commitWith sends.
func (c *database) acquire(ctx context.Context) (*batchTx, error) {
	conn, err := c.db.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &batchTx{tx: pipetx.New(conn.Conn()), pool: conn}, nil
}

// queueBegin adds BEGIN to b, the first round trip of a batch transaction.
func queueBegin(b *pgx.Batch) { b.Queue("BEGIN") }

// commitWith runs b and commits, in one round trip: COMMIT travels with
// the closing statements (and, for a one-trip batch, b begins with BEGIN:
// the whole transaction is this one round trip). When the transaction did
// not commit, or may not have, the error is a *commitError that says how
// far it got. Every batch transaction commits here, so what a failure of
// the round trip means is decided once.
func (t *batchTx) commitWith(ctx context.Context, b *pgx.Batch) error {
	if t.pool == nil {
		// Cut loose (an abandoned attempt): its connection is closed.
		return &commitError{stmt: notSent, err: errors.New("the transaction's connection was cut loose")}
	}
	done := countDone(b)
	queueCommit(b)
	err := t.pool.SendBatch(ctx, b).Close()
	if err == nil {
		t.done = true
		t.pool.Release()
		return nil
	}
	var pgErr *pgconn.PgError
	var pre pgx.ErrPreprocessingBatch
	switch {
	case errors.As(err, &pre), errors.As(err, &pgErr), errors.Is(err, pgx.ErrTxCommitRollback):
		// pgx refused a statement before sending it (an argument it cannot
		// encode, a statement the server could not prepare), or the server
		// answered with an error and skipped the rest of the pipeline,
		// COMMIT included, or rolled back at COMMIT. Either way nothing
		// committed; rollback ends what is left of the block.
		return &commitError{stmt: failedStatement(b, *done, err), err: err}
	}
	if pgconn.SafeToRetry(err) {
		// Nothing was sent (a connection pgx found busy or closed): no
		// statement is to blame, and nothing committed.
		return &commitError{stmt: notSent, err: err}
	}
	// No answer: the COMMIT may or may not have been applied.
	t.done = true
	t.pool.Release()
	return &commitError{stmt: -1, err: err}
}

// commitError means the transaction did not commit, or may not have.
type commitError struct {
	// stmt is the index in the batch of the statement that failed, the
	// batch's length for the COMMIT itself, notSent when nothing was sent,
	// or -1 when the outcome is unknown (the connection broke once the
	// COMMIT may have been sent).
	stmt int
	err  error
}

// notSent is commitError.stmt when nothing of the batch was sent.
const notSent = -2

func (e *commitError) Error() string { return e.err.Error() }
func (e *commitError) Unwrap() error { return e.err }

// unknown reports whether the COMMIT may have been applied.
func (e *commitError) unknown() bool { return e.stmt == -1 }

// countDone makes each of b's statements count itself once it succeeded,
// so that a failure can be placed.
func countDone(b *pgx.Batch) *int {
	done := new(int)
	for _, q := range b.QueuedQueries {
		fn := q.Fn
		q.Fn = func(br pgx.BatchResults) error {
			var err error
			if fn != nil {
				err = fn(br)
			} else {
				_, err = br.Exec()
			}
			if err == nil {
				*done++
			}
			return err
		}
	}
	return done
}

// failedStatement is the index in b of the statement err is about: the
// one pgx named when it refused to send the batch, else the first that did
// not succeed.
func failedStatement(b *pgx.Batch, done int, err error) int {
	var pre pgx.ErrPreprocessingBatch
	if errors.As(err, &pre) {
		for i, q := range b.QueuedQueries {
			if q.SQL == pre.SQL() {
				return i
			}
		}
	}
	return done
}

// rollback ends the transaction unless it was committed, within
// cleanup.Timeout whatever became of ctx (a shutdown cancelled it, say).
// On a broken connection the ROLLBACK fails too; pgx then closes the
// connection and the pool replaces it. A server that does not answer in
// time has the connection closed under it (see cleanup.Rollback): it
// rolls back when it notices, and neither the worker nor a shutdown
// waits for it.
func (t *batchTx) rollback(ctx context.Context) {
	if t.done {
		return
	}
	t.done = true
	if t.hijacked {
		ctx, cancel := cleanup.Context(ctx)
		defer cancel()
		_ = t.tx.Conn().Close(ctx)
		return
	}
	if t.pool.Conn().PgConn().TxStatus() != 'I' {
		_ = cleanup.Rollback(ctx, t.tx)
	}
	t.pool.Release()
}

// netConn is the transaction's network connection, for the handler
// watchdog to close.
func (t *batchTx) netConn() net.Conn { return t.tx.Conn().PgConn().Conn() }

// queueCommit adds COMMIT to b, failing with pgx.ErrTxCommitRollback when
// the server answers ROLLBACK (the block was already aborted).
func queueCommit(b *pgx.Batch) {
	b.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return pgx.ErrTxCommitRollback
		}
		return nil
	})
}

// session is what every transaction of the consumer starts with: the
// configured timeouts, set for that transaction only.
type session struct {
	// sql sets them, and keeps what the transaction began as.
	sql  string
	args []any
	// oneTripHead opens a one-trip batch: the same settings and the
	// checked advance of the position in one SELECT (see oneTrip).
	oneTripHead string
	// racing is the same for a transaction that races the consumer's
	// others: its lock_timeout is raceLockTimeout's (see contention.go).
	// It costs nothing more: the same statement, another value.
	racing *session
}

// queue adds the settings to b, which runs in a transaction.
func (s *session) queue(b *pgx.Batch) { b.Queue(s.sql, s.args...) }

// session returns the current session settings.
func (c *database) session() *session { return c.sess.Load() }

// setSession sets the statement that applies the session settings, and
// the one that opens a one-trip batch: the same settings and the checked
// advance of the position in one SELECT.
func (c *database) setSession(cfg *Config, checkClient bool) {
	s := c.newSession(sessionSettings(cfg, checkClient))
	racing := *cfg
	racing.LockTimeout = raceLockTimeout(cfg)
	s.racing = c.newSession(sessionSettings(&racing, checkClient))
	c.sess.Store(s)
}

func (c *database) newSession(sql string, args []any) *session {
	// The one-trip head also opens the batch (see positions.QueueOpen),
	// with the advance's consumer, topic and partition.
	head := sql + ", " + c.positions.AdvanceChecked(len(args)+1) + ", " + c.positions.OpenExpr(len(args)+1)
	return &session{sql: sql, args: args, oneTripHead: head}
}

// sessionSettings builds the statement that applies the configured timeouts
// to the current transaction only (set_config(..., true) is SET LOCAL), so
// the pool's connections go back to the application unchanged. On Postgres
// 14 and later it also sets client_connection_check_interval, so that a
// statement whose client is gone (a hung handler cut off by closing its
// connection) is aborted within a second instead of running to its end.
// It also keeps the role and the session user the transaction began with,
// for the check after the handlers (see schema.AfterUserCode).
func sessionSettings(c *Config, checkClient bool) (string, []any) {
	sets := []string{schema.BeganAs}
	var args []any
	add := func(name, value string) {
		args = append(args, value)
		sets = append(sets, fmt.Sprintf("pg_catalog.set_config('%s', $%d, true)", name, len(args)))
	}
	for _, s := range []struct {
		name string
		d    time.Duration
	}{
		{"statement_timeout", c.StatementTimeout},
		{"lock_timeout", c.LockTimeout},
		{"idle_in_transaction_session_timeout", c.IdleInTransactionTimeout},
	} {
		if s.d != kafkaoncetype.LeaveUnset {
			add(s.name, strconv.FormatInt(s.d.Milliseconds(), 10))
		}
	}
	if checkClient {
		add("client_connection_check_interval", "1000")
	}
	return "SELECT " + strings.Join(sets, ", "), args
}

type querier = schema.Querier

// inTx runs fn in a transaction of its own with the session settings
// applied, committing when fn returns nil.
func (c *database) inTx(ctx context.Context, fn func(q querier) error) error {
	return pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if err := c.applySession(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// readOnly runs fn in a transaction, with the session settings applied,
// that is rolled back.
func (c *database) readOnly(ctx context.Context, fn func(q querier) error) error {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = cleanup.Rollback(ctx, tx) }()
	if err := c.applySession(ctx, tx); err != nil {
		return err
	}
	return fn(tx)
}

// applySession sets the session settings for the rest of tx.
func (c *database) applySession(ctx context.Context, tx pgx.Tx) error {
	s := c.session()
	_, err := tx.Exec(ctx, s.sql, s.args...)
	return err
}

// inOneTrip runs b's statements in a transaction with the session
// settings applied, in one round trip when the DB sends batches.
func (c *database) inOneTrip(ctx context.Context, b *pgx.Batch) error {
	full := &pgx.Batch{}
	c.session().queue(full)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	return pipetx.InOneTrip(ctx, c.db, full)
}
