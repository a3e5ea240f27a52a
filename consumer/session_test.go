package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// sendWays are how a handler's statements reach its transaction: through
// a Handler's tx, through a BatchHandler's Batch.Tx (which opens the
// transaction first), or queued with Batch.Queue, in one round trip or
// claim first.
var sendWays = []struct {
	name       string
	batch      bool // a BatchHandler
	queued     bool // Batch.Queue rather than Batch.Tx
	claimFirst bool
}{
	{name: "Handler"},
	{name: "Batch.Tx", batch: true},
	{name: "queued, one round trip", batch: true, queued: true},
	{name: "queued, ClaimFirst", batch: true, queued: true, claimFirst: true},
}

// misbehaving is a consumer of one partition whose handlers apply each
// message once, and, for the message bad, send stmts (ignoring what they
// answer) the way way says, after its effect.
func misbehaving(e *env, way int, bad string, stmts func(e *env) []string) *consumer.Config {
	w := sendWays[way]
	insert := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
	send := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if _, err := tx.Exec(ctx, insert, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value)); err != nil {
			return err
		}
		if m.ID == bad {
			for _, sql := range stmts(e) {
				_, _ = tx.Exec(ctx, sql)
			}
		}
		return nil
	}
	var cfg *consumer.Config
	switch {
	case !w.batch:
		cfg = e.config(consumer.HandlerFunc(send))
	case !w.queued:
		cfg = batchConfig(e, consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
			for _, m := range b.Messages {
				if err := send(ctx, b.Tx, m); err != nil {
					return err
				}
			}
			return nil
		}))
	default:
		cfg = batchConfig(e, consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
			for _, m := range b.Messages {
				b.Queue(insert, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
				if m.ID == bad {
					for _, sql := range stmts(e) {
						b.Queue(sql)
					}
				}
			}
			return nil
		}))
	}
	cfg.ClaimFirst = w.claimFirst
	cfg.Retry.MaxAttempts = 2
	cfg.Retry.InitialInterval = 10 * time.Millisecond
	return cfg
}

// aroundCalls wraps the handler of cfg, a consumer of misbehaving's, so
// that do runs in each of its calls on the call's tx and messages, and
// calls apply to run the handler: for a Handler or a BatchHandler that
// uses Batch.Tx (a queued one queues only, and has no tx to hand).
func aroundCalls(cfg *consumer.Config, do func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message, apply func() error) error) {
	if h := cfg.BatchHandler; h != nil {
		cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
			return do(ctx, b.Tx, b.Messages, func() error { return h.HandleBatch(ctx, b) })
		})
		return
	}
	h := cfg.Handler
	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		return do(ctx, tx, []*consumer.Message{m}, func() error { return h.Handle(ctx, tx, m) })
	})
}

// runMisbehaving produces a first message (so that batches after it may go
// in one round trip), then five more with ids prefix-0 to prefix-4, and
// runs cfg until the partition is past them all.
func runMisbehaving(e *env, cfg *consumer.Config, prefix string) []string {
	e.produceIDs("w", 1)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
	ids := append([]string{"w-0"}, e.produceIDs(prefix, 5)...)
	e.waitCommitted(map[int]int64{0: 6}, 60*time.Second)
	r.stop()
	require.Empty(e.t, e.events.snapshot().stopped)
	return ids
}

// A handler sets a client encoding in which a byte pair is one character
// whose second byte is a backslash, then sends a text that a reader of
// bytes takes for a string, and the server for a string, a ROLLBACK, an
// effect of a message never produced and (in one case) a new transaction
// dressed as an open batch. Every text goes as one Parse message, which
// the server refuses whole, by every way of sending: the message is set
// aside, nothing of the text ran (no effect without its message: the
// checker), and every other message is applied once.
func TestNoClientEncodingSmugglesAStatementIntoABatch(t *testing.T) {
	t.Parallel()
	smuggle := func(reopen bool) func(e *env) []string {
		return func(e *env) []string {
			text := `SELECT E'` + "\x95\x5c" + `' AS memo; ROLLBACK; INSERT INTO ` + e.db.Table("effects") +
				` (message_id, topic, partition, kafka_offset, value) VALUES ('smuggled', 't', 0, 0, 'x'); SELECT 1`
			if reopen {
				text += fmt.Sprintf(`; BEGIN; SELECT %s('%s', '%s', 0)`, e.db.Table("open_batch"), e.name, e.topic)
			}
			return []string{`SET LOCAL client_encoding = 'SJIS'`, text}
		}
	}
	for way, w := range sendWays {
		for _, reopen := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, the batch reopened %v", w.name, reopen), func(t *testing.T) {
				t.Parallel()
				e := setup(t, 1)
				ids := runMisbehaving(e, misbehaving(e, way, "x-2", smuggle(reopen)), "x")
				require.Contains(t, e.letters(), "x-2")
				e.check(expectation{ids: ids, poison: []string{"x-2"}})
			})
		}
	}
}

// A handler that leaves the session unfit for the consumer's statements
// after it (the claims' status, the dead letters, the position, written
// in the same transaction) is set aside as a misuse of its transaction,
// whichever way it sent the statement; the other messages are applied
// once, their claims stored under their ids (here with letters a LATIN1
// reading would change).
func TestAHandlerChangingTheSessionIsSetAside(t *testing.T) {
	t.Parallel()
	for name, stmts := range map[string]func(e *env) []string{
		"client_encoding LATIN1, SET LOCAL": statements(`SET LOCAL client_encoding = 'LATIN1'`),
		"client_encoding LATIN1, SET":       statements(`SET client_encoding = 'LATIN1'`),
		"session_replication_role replica":  statements(`SELECT set_config('session_replication_role', 'replica', true)`),
		"a schema before pg_catalog": func(e *env) []string {
			return []string{`SELECT set_config('search_path', '` + e.db.Schema + `, pg_catalog', true)`}
		},
	} {
		for way, w := range sendWays {
			t.Run(name+", "+w.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, 1)
				ids := runMisbehaving(e, misbehaving(e, way, "é-2", stmts), "é")
				l := e.letters()["é-2"]
				require.Equal(t, deadletter.ClassTxMisuse, l.Class, "the letter of é-2: %s", l.Error)
				require.Contains(t, l.Error, "changed a setting of the session")
				require.Equal(t, "dead_lettered", e.claimStatus("é-2"))
				e.check(expectation{ids: ids, poison: []string{"é-2"}})
			})
		}
	}
}

// statements is a fixed list of statements.
func statements(sql ...string) func(*env) []string { return func(*env) []string { return sql } }

// What a handler may change for its own statements it may: its role, for
// row-level security (the consumer's statements run as the transaction
// began, here as a role the handler's may not touch kafkaonce's tables
// with), a setting of its own, a statement timeout.
func TestAHandlerMaySetItsRoleForRowLevelSecurity(t *testing.T) {
	t.Parallel()
	for way, w := range sendWays {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			effects := e.db.Table("effects")
			tenant := e.db.NewRole(t, `SELECT, INSERT ON `+effects)
			e.db.Exec(t, `ALTER TABLE `+effects+` ENABLE ROW LEVEL SECURITY`)
			e.db.Exec(t, `CREATE POLICY own ON `+effects+` TO `+tenant+` USING (value LIKE current_setting('app.tenant') || '%') WITH CHECK (value LIKE current_setting('app.tenant') || '%')`)
			require.Zero(t, e.db.Int(t, `SELECT count(*) FROM unnest(ARRAY['processed_messages', 'consumer_offsets', 'open_batches']) AS k(t)
				WHERE has_table_privilege($1, $2 || '.' || k.t, 'SELECT,INSERT,UPDATE,DELETE')`, tenant, e.db.Schema))
			cfg := misbehaving(e, way, "", nil)
			role := []string{`SET LOCAL ROLE ` + tenant, `SELECT set_config('app.tenant', 'v-', true)`, `SET LOCAL statement_timeout = '10s'`}
			if w.queued {
				h := cfg.BatchHandler
				cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
					for _, sql := range role {
						b.Queue(sql)
					}
					return h.HandleBatch(ctx, b)
				})
			} else {
				aroundCalls(cfg, func(ctx context.Context, tx pgx.Tx, _ []*consumer.Message, apply func() error) error {
					for _, sql := range role {
						if _, err := tx.Exec(ctx, sql); err != nil {
							return err
						}
					}
					return apply()
				})
			}
			ids := runMisbehaving(e, cfg, "x")
			require.Empty(t, e.letters())
			e.check(expectation{ids: ids})
		})
	}
}

// A large-object API a handler kept refuses once its call is over, and
// makes nothing.
func TestLargeObjectsKeptByAHandlerRefuseAfterItsCall(t *testing.T) {
	t.Parallel()
	for way, w := range sendWays[:2] {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			var mu sync.Mutex
			var kept []pgx.LargeObjects
			keep := func(tx pgx.Tx) {
				mu.Lock()
				defer mu.Unlock()
				kept = append(kept, tx.LargeObjects())
			}
			cfg := misbehaving(e, way, "", nil)
			aroundCalls(cfg, func(_ context.Context, tx pgx.Tx, _ []*consumer.Message, apply func() error) error {
				keep(tx)
				return apply()
			})
			before := e.db.Int(t, `SELECT count(*) FROM pg_largeobject_metadata`)
			ids := runMisbehaving(e, cfg, "x")
			require.NotEmpty(t, kept)
			for _, lo := range kept {
				_, err := lo.Create(context.Background(), 0)
				require.ErrorIs(t, err, consumer.ErrTxCallOver)
			}
			require.Equal(t, before, e.db.Int(t, `SELECT count(*) FROM pg_largeobject_metadata`))
			e.check(expectation{ids: ids})
		})
	}
}

// A redriven letter's handler that leaves the session unfit for the
// consumer's statements fails its redrive, with nothing applied; fixed,
// the redrive applies it once.
func TestARedriveChangingTheSessionFails(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("é", 3)
	var redriving, fixed atomic.Bool
	apply := e.applyHandler()
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "é-1" && !redriving.Load():
			return consumer.Permanent(fmt.Errorf("rejected by the partner"))
		case m.ID == "é-1" && !fixed.Load():
			if _, err := tx.Exec(ctx, `SET LOCAL client_encoding = 'LATIN1'`); err != nil {
				return err
			}
		}
		return apply.Handle(ctx, tx, m)
	}))
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	r.stop()
	require.Contains(t, e.letters(), "é-1")

	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	redriving.Store(true)
	res, err := c.Redrive(context.Background(), consumer.RedriveFilter{})
	require.NoError(t, err)
	require.Len(t, res.Failed, 1)
	require.ErrorIs(t, res.Failed[0], consumer.ErrSessionChanged)
	require.Zero(t, res.Applied)

	fixed.Store(true)
	res, err = c.Redrive(context.Background(), consumer.RedriveFilter{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Applied)
	e.requireExactlyOnce(ids)
	require.Equal(t, "applied", e.claimStatus("é-1"))
}

// A statement prepared under a name a text could be (pgx would run it in
// place of that text, the consumer's own COMMIT included, for the rest of
// the session) is refused, and its message set aside; the other messages
// are applied once, and the partition's offsets follow what committed.
func TestAStatementPreparedUnderAStatementsNameIsSetAside(t *testing.T) {
	t.Parallel()
	for way, w := range sendWays[:2] {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			cfg := misbehaving(e, way, "", nil)
			aroundCalls(cfg, func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message, apply func() error) error {
				for _, m := range msgs {
					if m.ID == "x-4" {
						if _, err := tx.Prepare(ctx, "COMMIT", "SELECT 1"); err != nil {
							return err
						}
					}
				}
				return apply()
			})
			ids := runMisbehaving(e, cfg, "x")
			l := e.letters()["x-4"]
			require.Equal(t, deadletter.ClassTxMisuse, l.Class, "the letter of x-4: %s", l.Error)
			e.check(expectation{ids: ids, poison: []string{"x-4"}})
		})
	}
}

// A handler that set its role for row-level security (one that may not
// touch kafkaonce's tables) may still check its deferred constraints
// early: the batch's commit check is lifted and put back as the role the
// transaction began with, and the handler goes on as its own.
func TestSetConstraintsUnderARoleForRowLevelSecurity(t *testing.T) {
	t.Parallel()
	for way, w := range sendWays[:2] {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			effects := e.db.Table("effects")
			tenant := e.db.NewRole(t, `SELECT, INSERT ON `+effects)
			cfg := misbehaving(e, way, "", nil)
			aroundCalls(cfg, func(ctx context.Context, tx pgx.Tx, _ []*consumer.Message, apply func() error) error {
				if _, err := tx.Exec(ctx, `SET LOCAL ROLE `+tenant); err != nil {
					return err
				}
				if err := apply(); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, `SET CONSTRAINTS ALL IMMEDIATE`); err != nil {
					return err
				}
				var role string
				if err := tx.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
					return err
				}
				if role != tenant {
					return fmt.Errorf("the handler runs as %s after SET CONSTRAINTS, not as the role it set", role)
				}
				return nil
			})
			ids := runMisbehaving(e, cfg, "x")
			require.Empty(t, e.letters())
			e.check(expectation{ids: ids})
		})
	}
}
