package consumertest_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

func ledger(t *testing.T) (*testenv.DB, consumer.Config, []*consumer.Message) {
	db := testenv.NewEmptyDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("balances")+` (account text PRIMARY KEY, amount bigint NOT NULL)`)
	db.Exec(t, `INSERT INTO `+db.Table("balances")+` VALUES ('a', 100), ('b', 100)`)
	cfg := consumer.Config{
		Name:   "ledger",
		Schema: db.Schema,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			amount, _ := strconv.Atoi(string(m.Value))
			_, err := tx.Exec(ctx, `UPDATE `+db.Table("balances")+` SET amount = amount + CASE account WHEN 'a' THEN -$1::bigint ELSE $1::bigint END`, amount)
			return err
		}),
	}
	var msgs []*consumer.Message
	for i := range 20 {
		msgs = append(msgs, consumertest.NewMessage([]byte(strconv.Itoa(i)), consumertest.WithID("t-"+strconv.Itoa(i)), consumertest.WithPosition("", i%2, 0)))
	}
	return db, cfg, msgs
}

func TestReplayTwicePassesForAStableHandler(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	consumertest.ReplayTwice(t, db.Pool, &cfg, msgs, []string{db.Schema + ".balances"})
	require.EqualValues(t, 100-190, db.Int(t, `SELECT amount FROM `+db.Table("balances")+` WHERE account = 'a'`))
}

// The report of issue 23: with a fixed Name on one database, the second
// run met the first run's positions, fetched nothing and waited out its
// timeout. Each run now has a consumer of its own.
func TestReplayTwicePassesTwiceInARowOnOneDatabase(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	tables := []string{db.Schema + ".balances"}
	opts := consumertest.ReplayOptions{Timeout: 20 * time.Second}
	// What an earlier run under the plain Name (a crashed one, or one of an
	// older consumertest) left behind: positions at the end of its topic.
	_, err := consumer.Migrate(context.Background(), db.Pool, db.Schema)
	require.NoError(t, err)
	db.Exec(t, `INSERT INTO `+db.Table("consumer_offsets")+` (consumer, topic, partition, next_offset) VALUES ('ledger', 'replay-twice', 0, 10), ('ledger', 'replay-twice', 1, 10)`)
	var consumers []string
	for run := range 2 {
		started := time.Now()
		var r consumertest.ReplayResult
		t.Run("run "+strconv.Itoa(run+1), func(t *testing.T) {
			r = consumertest.ReplayTwice(t, db.Pool, &cfg, msgs, tables, opts)
		})
		require.Equal(t, len(msgs), r.Applied, "run %d applied", run+1)
		require.Less(t, time.Since(started), opts.Timeout, "run %d waited out its timeout", run+1)
		consumers = append(consumers, r.Consumer)
	}
	require.Equal(t, "ledger", cfg.Name, "ReplayTwice changed the caller's Config")
	require.NotEqual(t, consumers[0], consumers[1])
	require.True(t, strings.HasPrefix(consumers[0], "ledger~replay-"), consumers[0])
	// Both runs applied every transfer: 190 moved twice.
	require.EqualValues(t, 100-2*190, db.Int(t, `SELECT amount FROM `+db.Table("balances")+` WHERE account = 'a'`))
	// What each run's consumer left is deleted when its (passing) test ends.
	for _, name := range consumers {
		require.Zero(t, db.Int(t, `SELECT count(*) FROM `+db.Table("consumers")+` WHERE name = $1`, name), "consumer %s left behind", name)
		require.Zero(t, db.Int(t, `SELECT count(*) FROM `+db.Table("consumer_offsets")+` WHERE consumer = $1`, name), "positions of %s left behind", name)
	}
}

// A partition stopped at a poison message can never settle: ReplayTwice
// says so at once instead of waiting out its timeout.
func TestReplayTwiceFailsAtOnceWhenAPartitionStops(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	cfg.OnPermanentFailure = consumer.StopPartition
	inner := cfg.Handler
	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "t-3" {
			return consumer.Permanent(errors.New("poison"))
		}
		return inner.Handle(ctx, tx, m)
	})
	started := time.Now()
	got := &captured{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		consumertest.ReplayTwice(capturingTB{TB: t, got: got}, db.Pool, &cfg, msgs, []string{db.Schema + ".balances"}, consumertest.ReplayOptions{Timeout: 50 * time.Second})
	}()
	<-done
	require.Len(t, got.failures(), 1)
	require.Contains(t, got.failures()[0], "a partition stopped")
	require.Contains(t, got.failures()[0], "poison")
	require.Less(t, time.Since(started), 40*time.Second, "ReplayTwice waited for a stopped partition")
}

func TestReplayTwiceCatchesAnUnstableMessageID(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	// A producer-side bug in miniature: the id is made up at delivery time.
	cfg.MessageID = consumer.MessageIDFunc(func(*consumer.Message) (string, error) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]), nil
	})
	got := replayCapturing(t, db, cfg, msgs, []string{db.Schema + ".balances"})
	require.Len(t, got.failures(), 1)
	require.Contains(t, got.failures()[0], "changed table "+db.Schema+".balances")
	require.Contains(t, got.failures()[0], "a message's id is not the same at each delivery")
}

// mailer is the ledger of ledger() plus an emails table the handler writes
// a row to per message: through tx when viaPool is false, through the pool
// (outside the handler's transaction) when it is true.
func mailer(t *testing.T, viaPool bool) (*testenv.DB, consumer.Config, []*consumer.Message, *callCount) {
	db, cfg, msgs := ledger(t)
	db.Exec(t, `CREATE TABLE `+db.Table("emails")+` (n bigserial PRIMARY KEY, message_id text NOT NULL, body text NOT NULL)`)
	ledgerHandler := cfg.Handler
	calls := &callCount{n: map[string]int{}}
	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		calls.add(m.ID)
		if err := ledgerHandler.Handle(ctx, tx, m); err != nil {
			return err
		}
		insert := `INSERT INTO ` + db.Table("emails") + ` (message_id, body) VALUES ($1, $2)`
		var err error
		if viaPool {
			_, err = db.Pool.Exec(ctx, insert, m.ID, "moved "+string(m.Value))
		} else {
			_, err = tx.Exec(ctx, insert, m.ID, "moved "+string(m.Value))
		}
		return err
	})
	return db, cfg, msgs, calls
}

type callCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCount) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[id]++
}

func (c *callCount) min() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	least := -1
	for _, n := range c.n {
		if least < 0 || n < least {
			least = n
		}
	}
	return least
}

// The handler of issue 22: it sends its email through the pool, so an
// attempt that is rolled back and run again sends it twice.
func TestReplayTwiceCatchesAWriteOutsideTheHandlersTransaction(t *testing.T) {
	t.Parallel()
	db, cfg, msgs, _ := mailer(t, true)
	got := replayCapturing(t, db, cfg, msgs, []string{db.Schema + ".balances", db.Schema + ".emails"})
	require.NotEmpty(t, got.failures(), "a handler writing outside tx passed")
	require.Contains(t, got.failures()[0], "table "+db.Schema+".emails")
	require.Contains(t, got.failures()[0], "rolled back")
	require.Contains(t, got.failures()[0], "20 rows added")
	for _, f := range got.failures() {
		require.NotContains(t, f, ".balances", "the ledger's writes go through tx: %s", f)
	}
}

func TestReplayTwiceFailsWhenNothingWasApplied(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	cfg.Handler = consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error {
		return consumer.Permanent(errors.New("no such account"))
	})
	got := replayCapturing(t, db, cfg, msgs, []string{db.Schema + ".balances"})
	require.Len(t, got.failures(), 1)
	require.Contains(t, got.failures()[0], "applied none of the 20 messages")
	require.Contains(t, got.failures()[0], "20 dead-lettered")
	require.Contains(t, got.failures()[0], "the dead letters say why:")
	require.Contains(t, got.failures()[0], "permanent: no such account", "the class and the error, in the failure itself")
	require.Contains(t, got.failures()[0], db.Schema+".dead_letters")
}

// A handler that writes with tx only passes, and ReplayTwice ran it more
// than once per message, as the consumer may.
func TestReplayTwicePassesAHandlerWritingOnlyWithTx(t *testing.T) {
	t.Parallel()
	db, cfg, msgs, calls := mailer(t, false)
	got := replayCapturing(t, db, cfg, msgs, []string{db.Schema + ".balances", db.Schema + ".emails"})
	require.Empty(t, got.failures())
	require.EqualValues(t, 20, db.Int(t, `SELECT count(*) FROM `+db.Table("emails")), "one email per message")
	require.EqualValues(t, 100-190, db.Int(t, `SELECT amount FROM `+db.Table("balances")+` WHERE account = 'a'`))
	require.Len(t, calls.n, 20)
	require.GreaterOrEqual(t, calls.min(), 2, "every message's handler ran more than once")
}

// A BatchHandler is run the same way, its queued statements included.
func TestReplayTwiceChecksABatchHandler(t *testing.T) {
	t.Parallel()
	for _, viaPool := range []bool{false, true} {
		t.Run("via pool "+strconv.FormatBool(viaPool), func(t *testing.T) {
			t.Parallel()
			db, cfg, msgs := ledger(t)
			db.Exec(t, `CREATE TABLE `+db.Table("emails")+` (message_id text NOT NULL)`)
			cfg.Handler = nil
			cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
				for _, m := range b.Messages {
					if viaPool {
						if _, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("emails")+` VALUES ($1)`, m.ID); err != nil {
							return err
						}
						continue
					}
					b.Queue(`INSERT INTO `+db.Table("emails")+` VALUES ($1)`, m.ID)
				}
				return nil
			})
			got := replayCapturing(t, db, cfg, msgs, []string{db.Schema + ".emails"})
			if !viaPool {
				require.Empty(t, got.failures())
				require.EqualValues(t, 20, db.Int(t, `SELECT count(*) FROM `+db.Table("emails")))
				return
			}
			require.NotEmpty(t, got.failures())
			require.Contains(t, got.failures()[0], "table "+db.Schema+".emails")
			require.Contains(t, got.failures()[0], "rolled back")
		})
	}
}

// captured is what ReplayTwice reported through a capturingTB.
type captured struct {
	mu     sync.Mutex
	errors []string
	fatal  string
}

func (c *captured) failures() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]string(nil), c.errors...)
	if c.fatal != "" {
		out = append(out, c.fatal)
	}
	return out
}

// capturingTB records ReplayTwice's failures instead of failing the test;
// its Fatalf ends the goroutine ReplayTwice runs on, as testing's does.
type capturingTB struct {
	testing.TB
	got *captured
}

func (c capturingTB) Errorf(format string, args ...any) {
	c.got.mu.Lock()
	defer c.got.mu.Unlock()
	c.got.errors = append(c.got.errors, strings.TrimSpace(fmt.Sprintf(format, args...)))
}

func (c capturingTB) Fatalf(format string, args ...any) {
	c.got.mu.Lock()
	c.got.fatal = fmt.Sprintf(format, args...)
	c.got.mu.Unlock()
	runtime.Goexit()
}

func replayCapturing(t *testing.T, db *testenv.DB, cfg consumer.Config, msgs []*consumer.Message, tables []string) *captured {
	got := &captured{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		consumertest.ReplayTwice(capturingTB{TB: t, got: got}, db.Pool, &cfg, msgs, tables)
	}()
	<-done
	for _, f := range got.failures() {
		t.Logf("ReplayTwice reported: %s", f)
	}
	return got
}

// replayTimed runs ReplayTwice with opts on a goroutine of its own and a
// capturing TB, and returns what it reported and how long it took.
func replayTimed(t *testing.T, db *testenv.DB, cfg consumer.Config, msgs []*consumer.Message, tables []string, opts consumertest.ReplayOptions) (*captured, time.Duration) {
	t.Helper()
	got := &captured{}
	done := make(chan struct{})
	started := time.Now()
	go func() {
		defer close(done)
		consumertest.ReplayTwice(capturingTB{TB: t, got: got}, db.Pool, &cfg, msgs, tables, opts)
	}()
	<-done
	took := time.Since(started)
	for _, f := range got.failures() {
		t.Logf("ReplayTwice reported after %v: %s", took.Round(time.Millisecond), f)
	}
	return got, took
}

// ReplayOptions.KeepPositions is documented as "the replay is skipped by
// position, as a plain group rewind is". But the second run keeps the
// stored positions at the end of the topic, so its consumer starts there,
// fetches nothing, and no message is ever reported applied, skipped or
// dead-lettered: runUntilSettled counts 0 of 20 and waits out the whole
// Timeout, then fails "replay: 0 of 20 messages settled within ...". The
// option can never pass, for any handler, and it waits out its timeout,
// which issue 23 says ReplayTwice must never do.
func TestReplayTwiceKeepPositionsPassesWithoutWaitingOutItsTimeout(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	opts := consumertest.ReplayOptions{KeepPositions: true, Timeout: 15 * time.Second}
	got, took := replayTimed(t, db, cfg, msgs, []string{db.Schema + ".balances"}, opts)
	require.Empty(t, got.failures(), "a stable handler failed ReplayTwice with KeepPositions")
	require.Less(t, took, opts.Timeout, "ReplayTwice waited out its timeout")
}

// ReplayTwice "sets the Kafka fields itself" so that a test can pass the
// Config its program uses. It sets Brokers, Topics, GroupID and the
// session timings, but keeps cfg.StartOffset: a program whose consumer
// starts at the latest offset (StartLatest, for "new events only") makes
// the first run's consumer join a fresh group after the messages were
// produced, start at the end of the topic and fetch none of them. It then
// waits out the whole Timeout and fails with "0 of 20 messages settled
// ..., with no failed attempt: raise ReplayOptions.Timeout if the handler
// is slow", blaming the handler.
func TestReplayTwiceIgnoresTheProgramsStartOffset(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	cfg.StartOffset = consumer.StartLatest
	opts := consumertest.ReplayOptions{Timeout: 15 * time.Second}
	got, took := replayTimed(t, db, cfg, msgs, []string{db.Schema + ".balances"}, opts)
	require.Empty(t, got.failures(), "ReplayTwice failed for a stable handler because of cfg.StartOffset")
	require.Less(t, took, opts.Timeout, "ReplayTwice waited out its timeout")
}

// The same with the program's Dialer: a production Config carries one for
// TLS (or SASL), and ReplayTwice keeps it while pointing Brokers at its
// in-process broker, which speaks plain TCP. No connection succeeds, no
// message settles, and ReplayTwice waits out its timeout with a message
// that blames a slow handler.
func TestReplayTwiceKeepsTheProgramsDialer(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	cfg.Dialer = &kafka.Dialer{Timeout: 5 * time.Second, DualStack: true, TLS: &tls.Config{MinVersion: tls.VersionTLS12}}
	opts := consumertest.ReplayOptions{Timeout: 15 * time.Second}
	got, took := replayTimed(t, db, cfg, msgs, []string{db.Schema + ".balances"}, opts)
	require.Empty(t, got.failures(), "ReplayTwice failed for a stable handler because of cfg.Dialer")
	require.Less(t, took, opts.Timeout, "ReplayTwice waited out its timeout")
}

// forgetConsumer deletes from "every table with a consumer column" of the
// schema, kafkaonce's or not. Tables of the application's own live in that
// schema in this package's own tests (ledger's balances) and in
// devenv.ForTest's documented pattern. One of them with a consumer column
// that is not text (a customer's number: loyalty points per consumer)
// makes the cleanup's DELETE ... WHERE consumer = 'ledger~replay-...' fail
// to encode, and a ReplayTwice that passed fails the test at cleanup.
func TestReplayTwiceCleanupTouchesTheApplicationsTables(t *testing.T) {
	t.Parallel()
	db, cfg, msgs := ledger(t)
	db.Exec(t, `CREATE TABLE `+db.Table("points")+` (consumer bigint PRIMARY KEY, points bigint NOT NULL)`)
	db.Exec(t, `INSERT INTO `+db.Table("points")+` VALUES (42, 7)`)
	got := &captured{}
	t.Run("replay", func(t *testing.T) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			consumertest.ReplayTwice(capturingTB{TB: t, got: got}, db.Pool, &cfg, msgs, []string{db.Schema + ".balances"})
		}()
		<-done
		require.Empty(t, got.failures(), "ReplayTwice itself passed")
	}) // the cleanup of the subtest runs forgetConsumer through the capturing TB
	require.Empty(t, got.failures(), "ReplayTwice passed, then its cleanup failed on a table of the application's")
	require.EqualValues(t, 1, db.Int(t, `SELECT count(*) FROM `+db.Table("points")))
}

// The consumer takes a nil MessageIDFunc for the default header ("it would
// otherwise panic on every message", Config.withDefaults). ReplayTwice's
// rolled-back attempt does not: it calls the nil function, recovers the
// panic, takes every message for one with an invalid id and skips its
// attempt, while the real consumer applies every message by the default
// header. So a handler that writes outside its transaction, which
// ReplayTwice is documented to catch (TestReplayTwiceCatchesAWriteOutside
// TheHandlersTransaction), passes.
func TestReplayTwiceNilMessageIDFuncHidesAWriteOutsideTx(t *testing.T) {
	t.Parallel()
	db, cfg, msgs, _ := mailer(t, true)
	cfg.MessageID = consumer.MessageIDFunc(nil)
	got := replayCapturing(t, db, cfg, msgs, []string{db.Schema + ".balances", db.Schema + ".emails"})
	require.NotEmpty(t, got.failures(), "a handler writing outside tx passed ReplayTwice")
}
