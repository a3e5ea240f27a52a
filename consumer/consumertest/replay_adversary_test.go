package consumertest_test

import (
	"crypto/tls"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/consumer/consumertest"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

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
func TestAdversaryReplayTwiceKeepPositionsPassesWithoutWaitingOutItsTimeout(t *testing.T) {
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
func TestAdversaryReplayTwiceIgnoresTheProgramsStartOffset(t *testing.T) {
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
func TestAdversaryReplayTwiceKeepsTheProgramsDialer(t *testing.T) {
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
func TestAdversaryReplayTwiceCleanupTouchesTheApplicationsTables(t *testing.T) {
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
func TestAdversaryReplayTwiceNilMessageIDFuncHidesAWriteOutsideTx(t *testing.T) {
	t.Parallel()
	db, cfg, msgs, _ := mailer(t, true)
	cfg.MessageID = consumer.MessageIDFunc(nil)
	got := replayCapturing(t, db, cfg, msgs, []string{db.Schema + ".balances", db.Schema + ".emails"})
	require.NotEmpty(t, got.failures(), "a handler writing outside tx passed ReplayTwice")
}
