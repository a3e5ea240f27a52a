package consumer_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// ledger is a table of a few hot accounts and transfers between them: each
// message moves one unit from one account to another, and its handler
// locks the two in sorted order, as a careful hand-written handler does.
type ledger struct {
	e        *env
	accounts int
	table    string
}

func newLedger(e *env, accounts int) *ledger {
	l := &ledger{e: e, accounts: accounts, table: e.db.Table("accounts")}
	e.db.Exec(e.t, `CREATE TABLE `+l.table+` (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, postings bigint NOT NULL DEFAULT 0)`)
	e.db.Exec(e.t, `INSERT INTO `+l.table+` (id) SELECT generate_series(0, $1::int - 1)`, accounts)
	return l
}

// produce writes n transfers over the partitions, with values "from:to".
func (l *ledger) produce(prefix string, n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 1))
	ids := make([]string, n)
	msgs := make([]kafka.Message, n)
	for i := range n {
		from := rng.IntN(l.accounts)
		to := (from + 1 + rng.IntN(l.accounts-1)) % l.accounts
		ids[i] = fmt.Sprintf("%s-%d", prefix, i)
		msgs[i] = msg(i%l.e.parts, ids[i], fmt.Sprintf("%d:%d", from, to))
	}
	l.e.kafka.Produce(l.e.t, l.e.topic, msgs...)
	return ids
}

// transfer moves one unit between two accounts.
type transfer struct{ from, to int }

// postings are a transfer's two updates, the lower account id first.
func (l *ledger) postings(t transfer) (sql string, args [2][2]any) {
	sql = `UPDATE ` + l.table + ` SET balance = balance + $2, postings = postings + 1 WHERE id = $1`
	if t.from < t.to {
		return sql, [2][2]any{{t.from, int64(-1)}, {t.to, int64(1)}}
	}
	return sql, [2][2]any{{t.to, int64(1)}, {t.from, int64(-1)}}
}

// post applies t in tx.
func (l *ledger) post(ctx context.Context, tx pgx.Tx, t transfer) error {
	sql, args := l.postings(t)
	for _, a := range args {
		if _, err := tx.Exec(ctx, sql, a[:]...); err != nil {
			return err
		}
	}
	return nil
}

// queue adds t's postings to a BatchHandler's batch.
func (l *ledger) queue(b *consumer.Batch, t transfer) {
	sql, args := l.postings(t)
	for _, a := range args {
		b.Queue(sql, a[:]...)
	}
}

// handler applies a transfer: the effects row the checker reads, then the
// two accounts, the lower id first.
func (l *ledger) handler() consumer.Handler {
	effect := l.e.applyHandler()
	return consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		var t transfer
		if _, err := fmt.Sscanf(string(m.Value), "%d:%d", &t.from, &t.to); err != nil {
			return consumer.Permanent(err)
		}
		return l.post(ctx, tx, t)
	})
}

// requireBalanced asserts that n transfers were each posted once.
func (l *ledger) requireBalanced(n int) {
	l.e.t.Helper()
	require.EqualValues(l.e.t, 0, l.e.db.Int(l.e.t, `SELECT sum(balance) FROM `+l.table), "balances sum to zero")
	require.EqualValues(l.e.t, 2*n, l.e.db.Int(l.e.t, `SELECT sum(postings) FROM `+l.table), "two postings per transfer")
}

// progress keeps, per partition, when its transactions committed.
type progress struct {
	mu      sync.Mutex
	start   time.Time
	commits map[int][]time.Time
}

func newProgress() *progress { return &progress{start: time.Now(), commits: map[int][]time.Time{}} }

func (p *progress) OnBatchEnd(_ context.Context, b consumer.BatchInfo, r consumer.BatchResult) {
	if r.Err == nil {
		p.mu.Lock()
		p.commits[b.Partition] = append(p.commits[b.Partition], time.Now())
		p.mu.Unlock()
	}
}

// longestGap is the longest time a partition went without a commit, from
// the start to its last commit, and where it was.
func (p *progress) longestGap() (gap time.Duration, partition int, from time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for part, ts := range p.commits {
		prev := p.start
		for _, t := range ts {
			if d := t.Sub(prev); d > gap {
				gap, partition, from = d, part, prev.Sub(p.start)
			}
			prev = t
		}
	}
	return gap, partition, from
}

// contentions counts the hook's reports.
type contentions struct {
	mu      sync.Mutex
	n       int
	serial  int
	minSize int
	failed  int
}

// OnMessageFailed counts failures of messages, which contention must never
// cause.
func (c *contentions) OnMessageFailed(context.Context, *consumer.Message, consumer.Failure) {
	c.mu.Lock()
	c.failed++
	c.mu.Unlock()
}

func (c *contentions) OnContention(_ context.Context, _ consumer.BatchInfo, ct consumer.Contention) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if ct.Serialized {
		c.serial++
	}
	if c.minSize == 0 || ct.BatchLimit < c.minSize {
		c.minSize = ct.BatchLimit
	}
}

func (c *contentions) count() (n, serialized, failed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.serial, c.failed
}

// A per-message Handler on a handful of hot rows, many partitions, the
// default batch size: every batch touches every account, each in its own
// message order, so concurrent batches deadlock. They must adapt (smaller
// batches, then their turn at the consumer's gate) and drain; retrying
// the same batch the same way deadlocks again and again, for minutes.
func TestADeadlockStormOnHotRowsDrains(t *testing.T) {
	t.Parallel()
	const partitions, transfers = 12, 12000
	e := setup(t, partitions)
	l := newLedger(e, 5)
	ids := l.produce("t", transfers, 1)

	seen, prog := &contentions{}, newProgress()
	cfg := e.config(l.handler())
	cfg.MaxBatch = consumer.DefaultMaxBatch
	cfg.Hooks = append(cfg.Hooks, seen, prog)
	r := e.start(cfg)
	// Retrying each deadlocked batch unchanged misses this by far.
	e.waitEffects(transfers, 60*time.Second)
	gap, part, at := prog.longestGap()
	t.Logf("drained %d transfers over %d partitions and 5 accounts in %v; longest time without a commit: %v (partition %d, from %v)",
		transfers, partitions, time.Since(prog.start).Round(time.Millisecond), gap.Round(time.Millisecond), part, at.Round(time.Millisecond))
	r.stop()

	l.requireBalanced(transfers)
	e.check(expectation{ids: ids})
	n, serialized, failed := seen.count()
	require.Positive(t, n, "the hook saw the contention")
	require.Positive(t, serialized, "partitions took the gate")
	require.Zero(t, failed, "contention is never a message's failure")
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")))
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("message_attempts")), "no attempt was counted")
}

// Handlers in REPEATABLE READ transactions (the pool's default isolation)
// that read a hot row and write it back: concurrent partitions fail each
// other's transactions with serialization failures, at the UPDATE or at
// COMMIT. Each is run again, and every transfer is posted once.
func TestSerializationFailuresUnderRepeatableReadAreRetried(t *testing.T) {
	t.Parallel()
	const partitions, transfers = 6, 1500
	e := setup(t, partitions)
	l := newLedger(e, 3)
	ids := l.produce("rr", transfers, 2)
	pool := repeatableReadPool(t, e)

	effect := e.applyHandler()
	read := `SELECT balance FROM ` + l.table + ` WHERE id = $1`
	write := `UPDATE ` + l.table + ` SET balance = $2, postings = postings + 1 WHERE id = $1`
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var iso string
		if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&iso); err != nil {
			return err
		}
		if iso != "repeatable read" {
			return consumer.Permanent(fmt.Errorf("the handler runs in %s", iso))
		}
		if err := effect.Handle(ctx, tx, m); err != nil {
			return err
		}
		var from, to int
		if _, err := fmt.Sscanf(string(m.Value), "%d:%d", &from, &to); err != nil {
			return consumer.Permanent(err)
		}
		for _, acct := range []struct {
			id     int
			amount int64
		}{{min(from, to), 1}, {max(from, to), -1}} {
			if from > to {
				acct.amount = -acct.amount
			}
			var balance int64
			if err := tx.QueryRow(ctx, read, acct.id).Scan(&balance); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, write, acct.id, balance+acct.amount); err != nil {
				return err
			}
		}
		return nil
	})
	seen := &contentions{}
	cfg := e.config(h)
	cfg.MaxBatch = consumer.DefaultMaxBatch
	cfg.Hooks = append(cfg.Hooks, seen)
	e.start(cfg, pool)
	e.waitEffects(transfers, 60*time.Second)

	l.requireBalanced(transfers)
	e.check(expectation{ids: ids})
	n, _, failed := seen.count()
	require.Positive(t, n, "transactions failed to serialize and were retried")
	require.Zero(t, failed, "contention is never a message's failure")
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")))
}

// A row held by a transaction outside the consumer, for longer than the
// consumer's LockTimeout: every transaction that needs it fails with a lock
// timeout (55P03). That is contention, not the messages' fault: they are
// retried, without counting attempts (MaxAttempts 2 would set them aside
// at once), until the row is free, and then applied once.
func TestALockHeldOutsideTheConsumerIsWaitedOutWithoutCountingAttempts(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	l := newLedger(e, 2)
	ids := l.produce("held", 20, 3)

	ctx := context.Background()
	outside, err := e.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer outside.Rollback(ctx)
	_, err = outside.Exec(ctx, `SELECT * FROM `+l.table+` WHERE id = 0 FOR UPDATE`)
	require.NoError(t, err)

	seen := &contentions{}
	cfg := e.config(l.handler())
	cfg.LockTimeout = 100 * time.Millisecond
	cfg.Retry.MaxAttempts = 2
	cfg.Hooks = append(cfg.Hooks, seen)
	e.start(cfg)
	waitFor(t, 20*time.Second, "transactions losing to the held row", func() bool { n, _, _ := seen.count(); return n >= 5 })
	require.Zero(t, e.distinctEffects(), "nothing applied while the row is held")
	require.NoError(t, outside.Commit(ctx))

	e.waitEffects(20, 30*time.Second)
	l.requireBalanced(20)
	e.check(expectation{ids: ids})
	_, _, failed := seen.count()
	require.Zero(t, failed, "lock timeouts are never a message's failure")
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")))
}

// repeatableReadPool is a pool whose transactions are REPEATABLE READ
// unless told otherwise (default_transaction_isolation), as a user may
// configure theirs.
func repeatableReadPool(t *testing.T, e *env) *pgxpool.Pool {
	return e.db.PoolVia(t, e.db.ServerAddr(t), func(c *pgxpool.Config) {
		c.MaxConns = 16
		c.ConnConfig.RuntimeParams["default_transaction_isolation"] = "repeatable read"
	})
}
