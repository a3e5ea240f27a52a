package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A handler can end the consumer's transaction without tx.Commit or
// tx.Rollback, which the guard refuses: with a COMMIT or ROLLBACK
// statement, sent through tx or queued. A COMMIT in mid-batch would make
// every claim of the batch durable, those of messages not handled yet
// included, and whatever failed after it would have the retry skip them.
// Postgres refuses such a COMMIT (the batch is not closed), a ROLLBACK is
// caught when the batch closes, and the message whose handler did it is
// set aside; every other message is applied once, whatever fails after
// the statement.
func TestAHandlerEndingItsTransactionWithAStatementIsSetAside(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		stmt string
		// then is what fails after the statement: the next message, once
		// ("transient"), or x-2's own handler, past HandlerTimeout.
		then string
		// queued: a BatchHandler queueing the statement after x-2's
		// effect; a queued division by zero for x-4 when then is "later".
		queued, claimFirst bool
		// rewritten: the text sent is "SELECT 1", and a QueryRewriter
		// among its arguments (as pgx.NamedArgs is) makes it stmt.
		rewritten bool
	}{
		{name: "ROLLBACK through tx", stmt: "ROLLBACK"},
		{name: "COMMIT through tx", stmt: "COMMIT"},
		{name: "COMMIT; BEGIN through tx, then a transient failure", stmt: "COMMIT; BEGIN", then: "transient"},
		{name: "COMMIT AND CHAIN through tx, then a transient failure", stmt: "COMMIT AND CHAIN", then: "transient"},
		{name: "ROLLBACK AND CHAIN through tx, then a transient failure", stmt: "ROLLBACK AND CHAIN", then: "transient"},
		{name: "COMMIT through tx, then HandlerTimeout", stmt: "COMMIT", then: "timeout"},
		{name: "ROLLBACK queued, one round trip", stmt: "ROLLBACK", queued: true},
		{name: "COMMIT queued, one round trip", stmt: "COMMIT", queued: true},
		{name: "COMMIT queued, ClaimFirst", stmt: "COMMIT", queued: true, claimFirst: true},
		{name: "COMMIT by a rewriter through tx", stmt: "COMMIT", rewritten: true},
		{name: "COMMIT by a rewriter, queued", stmt: "COMMIT", queued: true, rewritten: true},
		{name: "COMMIT queued, then a failing queued statement, one round trip", stmt: "COMMIT", queued: true, then: "later"},
		{name: "COMMIT queued, then a failing queued statement, ClaimFirst", stmt: "COMMIT", queued: true, claimFirst: true, then: "later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			insert := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
			poison := []string{"x-2"}
			sql, args := tc.stmt, []any(nil)
			if tc.rewritten {
				sql, args = "SELECT 1", []any{rewriteTo(tc.stmt)}
			}
			var cfg *consumer.Config
			if tc.queued {
				if tc.then == "later" {
					poison = append(poison, "x-4")
				}
				cfg = batchConfig(e, consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
					for _, m := range b.Messages {
						if m.ID == "x-4" && tc.then == "later" {
							b.Queue(`SELECT 1/0`)
							continue
						}
						b.Queue(insert, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
						if m.ID == "x-2" {
							b.Queue(sql, args...)
						}
					}
					return nil
				}))
				cfg.ClaimFirst = tc.claimFirst
			} else {
				var flaked atomic.Bool
				apply := e.applyHandler()
				cfg = e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if err := apply.Handle(ctx, tx, m); err != nil {
						return err
					}
					switch {
					case m.ID == "x-2":
						_, err := tx.Exec(ctx, sql, args...)
						if tc.then == "timeout" {
							<-ctx.Done()
							return ctx.Err()
						}
						return err
					case m.ID == "x-3" && tc.then == "transient" && flaked.CompareAndSwap(false, true):
						return errors.New("flaky downstream, once")
					}
					return nil
				}))
				if tc.then == "timeout" {
					cfg.HandlerTimeout = 300 * time.Millisecond
					cfg.Retry.MaxAttempts = 2
				}
			}
			e.produceIDs("w", 1)
			r := e.start(cfg)
			// A first batch stores a position, so the next may go in one
			// round trip.
			e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
			ids := append([]string{"w-0"}, e.produceIDs("x", 5)...)
			e.waitCommitted(map[int]int64{0: 6}, 60*time.Second)
			r.stop()
			require.Empty(t, e.events.snapshot().stopped)
			if tc.then != "timeout" {
				require.Equal(t, deadletter.ClassTxMisuse, e.letters()["x-2"].Class)
			}
			e.check(expectation{ids: ids, poison: poison})
		})
	}
}

// A handler that returns with a query's rows still open leaves the
// connection busy: pgx refuses every later statement before sending it.
// That is the handler's bug, found when its call returns: the message is
// set aside (nothing was sent, so no COMMIT outcome is unknown), and the
// rest of the batch is applied.
func TestAHandlerLeavingRowsOpenIsSetAside(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("q", 5)
	failed := &batchErrors{}
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := apply.Handle(ctx, tx, m); err != nil {
			return err
		}
		if m.ID == "q-3" {
			rows, err := tx.Query(ctx, `SELECT generate_series(1, 3)`)
			if err != nil {
				return err
			}
			rows.Next() // the first row only; rows stays open
		}
		return nil
	})
	cfg := e.config(h)
	cfg.Hooks = append(cfg.Hooks, failed)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 30*time.Second)
	r.stop()
	require.Zero(t, failed.containing("outcome unknown"))
	l := e.letters()["q-3"]
	require.Equal(t, deadletter.ClassTxMisuse, l.Class)
	require.Contains(t, l.Error, "rows still open")
	e.check(expectation{ids: ids, poison: []string{"q-3"}})
}

// A handler's tx refuses every use once its call is over, and never hands
// out the bare connection, which the guard could not follow.
func TestTheGuardedTxRefusesAfterTheCall(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("c", 2)
	var kept pgx.Tx
	var once sync.Once
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		once.Do(func() { kept = tx })
		return apply.Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	e.waitCommitted(map[int]int64{0: 2}, 30*time.Second)
	r.stop()
	_, err := kept.Exec(context.Background(), `INSERT INTO `+e.db.Table("effects")+` VALUES ('c-0', 't', 0, 0, 'late')`)
	require.ErrorIs(t, err, consumer.ErrTxCallOver)
	require.Nil(t, kept.Conn())
	e.check(expectation{ids: ids})
}

// The transaction's open mark is a setting: a handler statement that
// resets settings without ending anything (RESET ALL) must not be taken
// for one that ended its transaction.
func TestAHandlerResettingItsSettingsDoesNotEndTheTransaction(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("r", 3)
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		// Local settings of its own for a query, then back to the defaults.
		if _, err := tx.Exec(ctx, `SET LOCAL work_mem = '64MB'`); err != nil {
			return err
		}
		if err := apply.Handle(ctx, tx, m); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `RESET ALL`)
		return err
	})
	r := e.start(e.config(h))
	waitFor(t, 30*time.Second, "the batch to be committed or the partition to stop", func() bool {
		return len(e.events.snapshot().stopped) > 0 || e.kafka.CommittedOffsets(t, e.group, e.topic, 1)[0] == 3
	})
	r.stop()
	var msgs []string
	for _, s := range e.events.snapshot().stopped {
		msgs = append(msgs, strings.SplitN(s.Error(), ";", 2)[0])
	}
	require.Empty(t, msgs, "the transaction was never ended")
	e.check(expectation{ids: ids})
}

// rewriteTo is a pgx.QueryRewriter (the interface pgx.NamedArgs
// implements): pgx sends the text it returns instead of the one given.
type rewriteTo string

func (r rewriteTo) RewriteQuery(_ context.Context, _ *pgx.Conn, _ string, args []any) (string, []any, error) {
	return string(r), args, nil
}

// A handler may check its own deferred constraints early, with SET
// CONSTRAINTS … IMMEDIATE: it is no attempt to end the transaction, and
// the batch's commit check (a deferred trigger of its own) is lifted
// around it and put back, deferred again. A violation it finds is the
// message's; a COMMIT on its connection after it (around the guard, as
// code that got hold of the connection some other way) is still refused.
// Only Exec may send it: queued, it cannot be lifted around, and is
// refused with a message that says how to send it.
func TestAHandlerMayCheckItsDeferredConstraintsEarly(t *testing.T) {
	t.Parallel()
	const check = "SET CONSTRAINTS ALL IMMEDIATE"
	for _, tc := range []struct {
		name string
		// how: "handler" (Exec on tx), "batch" (Exec on Batch.Tx),
		// "queued" (Batch.Queue).
		how        string
		claimFirst bool
		// then, for x-2: "" (nothing), "violate" (a deferred unique key
		// of the handler's, broken before the check), "commit" (COMMIT on
		// the connection, around the guard, after the check).
		then  string
		class deadletter.Class
	}{
		{name: "Handler", how: "handler"},
		{name: "Handler finds its violation early", how: "handler", then: "violate", class: deadletter.ClassData},
		{name: "Handler commits around the guard after it", how: "handler", then: "commit", class: deadletter.ClassTxMisuse},
		{name: "BatchHandler through Batch.Tx, one round trip", how: "batch"},
		{name: "BatchHandler through Batch.Tx, ClaimFirst", how: "batch", claimFirst: true},
		{name: "BatchHandler through Batch.Tx finds its violation early", how: "batch", claimFirst: true, then: "violate", class: deadletter.ClassData},
		{name: "BatchHandler queues it", how: "queued", class: deadletter.ClassRetriesExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var bareConns testenv.BareConns
			e := setupWithDB(t, 1, bareConns.Option())
			keys := e.db.Table("handler_keys")
			e.db.Exec(t, `CREATE TABLE `+keys+` (k text, CONSTRAINT handler_keys_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)`)
			apply := e.applyHandler()
			handle := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if err := apply.Handle(ctx, tx, m); err != nil {
					return err
				}
				n := 1
				if m.ID == "x-2" && tc.then == "violate" {
					n = 2
				}
				for range n {
					if _, err := tx.Exec(ctx, `INSERT INTO `+keys+` VALUES ($1)`, m.ID); err != nil {
						return err
					}
				}
				if _, err := tx.Exec(ctx, check); err != nil {
					return fmt.Errorf("check the keys: %w", err)
				}
				if m.ID == "x-2" && tc.then == "commit" {
					conn, err := bareConns.Of(ctx, tx)
					if err != nil {
						return err
					}
					_, _ = conn.PgConn().Exec(ctx, "COMMIT").ReadAll()
				}
				return nil
			}
			var cfg *consumer.Config
			switch tc.how {
			case "handler":
				cfg = e.config(consumer.HandlerFunc(handle))
			case "batch":
				cfg = batchConfig(e, consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
					for _, m := range b.Messages {
						if err := handle(ctx, b.Tx, m); err != nil {
							return err
						}
					}
					return nil
				}))
			case "queued":
				insert := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
				cfg = batchConfig(e, consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
					for _, m := range b.Messages {
						b.Queue(insert, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
						if m.ID == "x-2" {
							b.Queue(check)
						}
					}
					return nil
				}))
				cfg.Retry.MaxAttempts = 2
			}
			cfg.ClaimFirst = tc.claimFirst
			e.produceIDs("w", 1)
			r := e.start(cfg)
			// A first batch stores a position, so the next may go in one
			// round trip.
			e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
			ids := append([]string{"w-0"}, e.produceIDs("x", 5)...)
			e.waitCommitted(map[int]int64{0: 6}, 60*time.Second)
			r.stop()
			require.Empty(t, e.events.snapshot().stopped)
			var poison []string
			if tc.class != "" {
				poison = []string{"x-2"}
				l := e.letters()["x-2"]
				require.Equal(t, tc.class, l.Class, "x-2's letter: %s", l.Error)
				if tc.how == "queued" {
					require.Contains(t, l.Error, "send SET CONSTRAINTS on its own, with tx.Exec")
				}
			} else {
				require.Empty(t, e.letters())
			}
			e.check(expectation{ids: ids, poison: poison})
		})
	}
}

// A handler that makes its transaction read only, by any of the ways the
// guard cannot read (set_config, a quoted setting name, pg_settings), has
// its message's failure counted and the message set aside after
// MaxAttempts: the batch wrote when it began, so the read-only transaction
// its statements or the consumer's closing ones meet is the handler's
// doing, never the server's.
func TestAHandlerThatMakesItsTransactionReadOnlyIsSetAside(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, stmt string }{
		{"set_config transaction_read_only, local", `SELECT set_config('transaction_read_only', 'on', true)`},
		{"SET with the setting's name quoted", `SET "transaction_read_only" = on`},
		{"SET LOCAL with the setting's name quoted", `SET LOCAL "transaction_read_only" TO on`},
		{"UPDATE pg_settings", `UPDATE pg_settings SET setting = 'on' WHERE name = 'transaction_read_only'`},
	} {
		for _, write := range []bool{false, true} {
			name := tc.name + "/then returns"
			if write {
				name = tc.name + "/then writes"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, 1)
				apply := e.applyHandler()
				cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if err := apply.Handle(ctx, tx, m); err != nil {
						return err
					}
					if m.ID != "x-2" {
						return nil
					}
					if _, err := tx.Exec(ctx, tc.stmt); err != nil {
						return fmt.Errorf("make it read only: %w", err)
					}
					if write {
						// Its own next write meets the read-only transaction.
						return apply.Handle(ctx, tx, m)
					}
					return nil
				}))
				cfg.Retry.MaxAttempts = 2
				ids := e.produceIDs("x", 5)
				r := e.start(cfg)
				e.waitCommitted(map[int]int64{0: 5}, 45*time.Second)
				r.stop()
				l, ok := e.letters()["x-2"]
				require.True(t, ok, "x-2, whose handler made the transaction read only, is set aside")
				require.Equal(t, deadletter.ClassRetriesExhausted, l.Class)
				e.check(expectation{ids: ids, poison: []string{"x-2"}})
			})
		}
	}
}

// A statement that fails for the message's data with a code that could
// also be a connection's (3D000: has_database_privilege of a database the
// message names, which does not exist) counts: the message is set aside
// after MaxAttempts instead of holding the partition for ever.
func TestAMessageNamingADatabaseThatDoesNotExistIsSetAside(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	apply := e.applyHandler()
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		db := "postgres"
		if m.ID == "x-2" {
			db = "a database the message names, which does not exist"
		}
		var ok bool
		if err := tx.QueryRow(ctx, `SELECT has_database_privilege($1, 'CONNECT')`, db).Scan(&ok); err != nil {
			return fmt.Errorf("check the tenant's database: %w", err)
		}
		return apply.Handle(ctx, tx, m)
	}))
	cfg.Retry.MaxAttempts = 2
	ids := e.produceIDs("x", 5)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 5}, 45*time.Second)
	r.stop()
	_, ok := e.letters()["x-2"]
	require.True(t, ok, "x-2 is set aside after MaxAttempts")
	e.check(expectation{ids: ids, poison: []string{"x-2"}})
}
