package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kafkaonce/kafkaonce/internal/pipetx"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// session is what every transaction of the consumer starts with: the
// configured timeouts, set for that transaction only.
type session struct {
	// sql sets them; empty when all are LeaveUnset.
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
func (s *session) queue(b *pgx.Batch) {
	if s.sql != "" {
		b.Queue(s.sql, s.args...)
	}
}

// session returns the current session settings.
func (c *deps) session() *session { return c.sess.Load() }

// setSession sets the statement that applies the session settings, and
// the one that opens a one-trip batch: the same settings and the checked
// advance of the position in one SELECT.
func (c *deps) setSession(cfg *Config, checkClient bool) {
	s := c.newSession(sessionSettings(cfg, checkClient))
	racing := *cfg
	racing.LockTimeout = raceLockTimeout(cfg)
	s.racing = c.newSession(sessionSettings(&racing, checkClient))
	c.sess.Store(s)
}

func (c *deps) newSession(sql string, args []any) *session {
	// The one-trip head also opens the batch (see positions.QueueOpen),
	// with the advance's consumer, topic and partition.
	head := c.offsets.AdvanceChecked(len(args)+1) + ", " + c.offsets.OpenExpr(len(args)+1)
	if sql == "" {
		head = "SELECT " + head
	} else {
		head = sql + ", " + head
	}
	return &session{sql: sql, args: args, oneTripHead: head}
}

// sessionSettings builds the statement that applies the configured timeouts
// to the current transaction only (set_config(..., true) is SET LOCAL), so
// the pool's connections go back to the application unchanged. On Postgres
// 14 and later it also sets client_connection_check_interval, so that a
// statement whose client is gone (a hung handler cut off by closing its
// connection) is aborted within a second instead of running to its end.
func sessionSettings(c *Config, checkClient bool) (string, []any) {
	var sets []string
	var args []any
	add := func(name, value string) {
		args = append(args, value)
		sets = append(sets, fmt.Sprintf("set_config('%s', $%d, true)", name, len(args)))
	}
	for _, s := range []struct {
		name string
		d    time.Duration
	}{
		{"statement_timeout", c.StatementTimeout},
		{"lock_timeout", c.LockTimeout},
		{"idle_in_transaction_session_timeout", c.IdleInTransactionTimeout},
	} {
		if s.d != LeaveUnset {
			add(s.name, strconv.FormatInt(s.d.Milliseconds(), 10))
		}
	}
	if checkClient {
		add("client_connection_check_interval", "1000")
	}
	if len(sets) == 0 {
		return "", nil
	}
	return "SELECT " + strings.Join(sets, ", "), args
}

type querier = schema.Querier

// inTx runs fn in a transaction of its own with the session settings
// applied, committing when fn returns nil.
func (c *deps) inTx(ctx context.Context, fn func(q querier) error) error {
	return pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
		if err := c.applySession(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// readOnly runs fn in a transaction, with the session settings applied,
// that is rolled back.
func (c *deps) readOnly(ctx context.Context, fn func(q querier) error) error {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := c.applySession(ctx, tx); err != nil {
		return err
	}
	return fn(tx)
}

// applySession sets the session settings for the rest of tx.
func (c *deps) applySession(ctx context.Context, tx pgx.Tx) error {
	s := c.session()
	if s.sql == "" {
		return nil
	}
	_, err := tx.Exec(ctx, s.sql, s.args...)
	return err
}

// inOneTrip runs b's statements in a transaction with the session
// settings applied, in one round trip when the DB sends batches.
func (c *deps) inOneTrip(ctx context.Context, b *pgx.Batch) error {
	full := &pgx.Batch{}
	c.session().queue(full)
	full.QueuedQueries = append(full.QueuedQueries, b.QueuedQueries...)
	return pipetx.InOneTrip(ctx, c.db, full)
}
