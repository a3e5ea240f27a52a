package consumer_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A letter holds text kafkaonce does not control: the handler's error
// (which may quote a binary payload) and the message's header names (NUL
// is legal in Kafka). Postgres refuses invalid UTF-8 and NUL in text and
// JSON; the letter is written all the same, with the header names intact,
// and the partition moves on.
func TestLettersOfTextPostgresRefusesAreWritten(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		ids := e.produceIDs("g", 2)
		// A binary payload, and a message without an id whose header name
		// holds a NUL byte.
		e.kafka.Produce(t, e.topic,
			kafka.Message{Key: []byte("bin"), Value: []byte{0xff, 0xfe, 0x00, 0x01},
				Headers: []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: []byte("g-bin")}, {Key: "trace\x00id\xff", Value: []byte{0}}}},
			kafka.Message{Key: []byte("k"), Value: []byte("no id"), Headers: []kafka.Header{{Key: "trace\x00id", Value: []byte("1")}}})
		ids = append(ids, "g-bin")
		ids = append(ids, e.produceIDs("h", 2)...)
		decode := func(m *consumer.Message) error {
			if m.ID == "g-bin" {
				return consumer.Permanent(fmt.Errorf("cannot decode payload %s", m.Value))
			}
			return nil
		}
		cfg := e.checkedConfig(batched, decode)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 6}, 30*time.Second)
		r.stop()
		letters := e.letters()
		require.Contains(t, letters["g-bin"].Error, "cannot decode payload")
		require.Equal(t, "trace\x00id\xff", letters["g-bin"].Headers[1].Key, "header names are kept as they were")
		require.Equal(t, "trace\x00id", letters["offset:3"].Headers[0].Key)
		e.check(expectation{ids: append(ids, "<no id>"), poison: []string{"g-bin", "<no id>"}})
	})
}

// When Postgres refuses one of the consumer's own closing statements for
// its data (here a trigger on dead_letters stands for any such refusal),
// it would refuse it again on every retry: the partition stops, saying
// why, instead of retrying without a word for ever.
func TestOwnStatementsRefusedForTheirDataStopThePartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.db.Exec(t, `CREATE FUNCTION `+e.db.Schema+`.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'letters refused' USING ERRCODE = '22023'; END $$`)
	e.db.Exec(t, `CREATE TRIGGER refuse BEFORE INSERT ON `+e.db.Table("dead_letters")+` FOR EACH ROW EXECUTE FUNCTION `+e.db.Schema+`.refuse()`)
	e.produceIDs("o", 3)
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "o-1" {
			return consumer.Permanent(errors.New("poison"))
		}
		return apply.Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	waitFor(t, 30*time.Second, "the partition to stop", func() bool { return len(e.events.snapshot().stopped) > 0 })
	r.stop()
	stopped := e.events.snapshot().stopped
	require.ErrorContains(t, stopped[0], "letters refused")
	require.ErrorContains(t, stopped[0], "would be again")
	require.Equal(t, map[int]int64{0: 0}, e.storedPositions(), "nothing of the batch committed: the position is the first start")
	require.Zero(t, e.effects())
}

// Each abandoned attempt gives its pool connection back at once: a handler
// that hangs on every attempt is set aside after MaxAttempts even with a
// pool of a connection per partition plus a few, and the pool closes as
// soon as Run returns.
func TestAbandonedHandlersGiveTheirPoolSlotsBack(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	pool := e.db.PoolVia(t, e.db.ServerAddr(t), testenv.MaxConns(4))
	ids := e.produceIDs("p", 4)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	hung := make(chan struct{}, 16)
	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "p-1" || m.ID == "p-9" {
			hung <- struct{}{}
			<-release // hangs for good, ignoring ctx
			return ctx.Err()
		}
		return apply.Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	cfg.HandlerTimeout = 100 * time.Millisecond
	cfg.Retry.InitialInterval, cfg.Retry.MaxInterval = time.Millisecond, 10*time.Millisecond
	c, err := consumer.New(pool, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.waitCommitted(map[int]int64{0: 4}, 60*time.Second)
	require.Contains(t, e.letters(), "p-1", "the hung message was set aside after MaxAttempts")
	require.Len(t, hung, consumer.DefaultMaxAttempts)
	require.Zero(t, pool.Stat().AcquiredConns(), "abandoned attempts hold no pool connection")

	// Once more, hung at shutdown.
	e.kafka.Produce(t, e.topic, msg(0, "p-9", "v"))
	<-hung
	cancel()
	require.NoError(t, <-done)
	closed := make(chan struct{})
	go func() { pool.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("pool.Close was still waiting 10s after Run returned")
	}
	e.requireExactlyOnce([]string{ids[0], ids[2], ids[3]})
}

// A letter keeps the message's timestamp, which Kafka lets a producer set
// to any int64 of milliseconds (one writing nanoseconds, a clock gone
// wrong): far past the year 294276 where Postgres' timestamptz ends. The
// message is set aside all the same, without its time, and the messages
// around it are applied.
func TestAPoisonMessageWithATimestampPostgresCannotStoreIsSetAside(t *testing.T) {
	t.Parallel()
	e := setupOn(t, 1, ownKafka(t)) // the in-process broker, whatever KAFKA_BROKERS says: its requests are rewritten
	// Clients written in Go compute the timestamp through UnixNano and
	// cannot send it; a Java producer sends any long. The broker stores
	// what it is sent: the batch's timestamps are set here, as such a
	// producer would have sent them. 13446744073709551 ms after the epoch
	// is about the year 426000.
	const ts = int64(13446744073709551)
	e.kafka.Fake.ControlKey(kmsg.Produce.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ProduceRequest)
		for i := range req.Topics {
			for j := range req.Topics[i].Partitions {
				r := req.Topics[i].Partitions[j].Records
				if req.Topics[i].Topic != e.topic || !bytes.Contains(r, []byte("t-bad")) {
					continue
				}
				binary.BigEndian.PutUint64(r[27:], uint64(ts)) // FirstTimestamp
				binary.BigEndian.PutUint64(r[35:], uint64(ts)) // MaxTimestamp
				binary.BigEndian.PutUint32(r[17:], crc32.Checksum(r[21:], crc32.MakeTable(crc32.Castagnoli)))
			}
		}
		return nil, nil, false
	})
	ids := e.produceIDs("t", 2)
	e.kafka.Produce(t, e.topic, msg(0, "t-bad", "bad"))
	ids = append(ids, "t-bad")
	ids = append(ids, e.produceIDs("u", 2)...)

	apply := e.applyHandler()
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "t-bad" {
			return consumer.Permanent(errors.New("undecodable"))
		}
		return apply.Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	waitFor(t, 30*time.Second, "the partition to be drained or stopped", func() bool {
		return len(e.events.snapshot().stopped) > 0 || e.kafka.CommittedOffsets(t, e.group, e.topic, 1)[0] == 5
	})
	r.stop()
	var msgs []string
	for _, s := range e.events.snapshot().stopped {
		msgs = append(msgs, s.Error())
	}
	require.Empty(t, msgs, "a poison message stopped the partition instead of being set aside")
	e.check(expectation{ids: ids, poison: []string{"t-bad"}})
	got := e.letters()["t-bad"].MessageTime
	if kafkaClient() == consumer.FranzGo {
		// franz-go decodes a timestamp through nanoseconds, which wrap
		// past the year 2262: the letter holds the wrapped time, a time
		// Postgres stores.
		require.Less(t, got.Year(), 2263, "the time franz-go decoded")
		return
	}
	require.True(t, got.IsZero(), "no time stored, got %v", got)
}

// The same refusal, found only at COMMIT: a deferred constraint trigger on
// dead_letters (a check of the operator's, say) refuses every letter when
// the transaction that writes it commits. Postgres will refuse it again on
// every retry, whichever message the letter is for, so the partition must
// stop and say why, as when the refusal comes with the statement; it must
// not take the refused COMMIT for the messages' fault (setting them
// aside, which writes another letter the trigger refuses) and go round
// for ever.
func TestOwnStatementsRefusedAtCommitForTheirDataStopThePartition(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		refusals := refuseAtCommit(t, e, "INSERT ON dead_letters", "", "22023", "letters refused")
		e.produceIDs("o", 3)
		poison := func(m *consumer.Message) error {
			if m.ID == "o-1" {
				return consumer.Permanent(errors.New("poison"))
			}
			return nil
		}
		cfg := e.checkedConfig(batched, poison)
		r := e.start(cfg)
		stopped := e.stoppedWithin(30 * time.Second)
		r.stop()
		require.True(t, stopped, "the partition did not stop within 30s; Postgres refused the letter's COMMIT %d times", refusals())
		require.ErrorContains(t, e.events.snapshot().stopped[0], "letters refused")
		require.Empty(t, e.letters())
		require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id = 'o-1'`), "the poison has no effect")
	})
}

// A refusal of the consumer's own position at COMMIT: a deferred
// constraint trigger of the operator's on consumer_offsets refuses to move
// the position past offset 2. Every handler succeeds; no message is at
// fault, and a retry, or a letter (whose transaction moves the position
// too), meets the same refusal. The partition must stop and say why, and
// no good message may be set aside for it (the first refusal, after a
// handler ran, cannot be told from the handler's own deferred constraint,
// so one report of a failure is allowed; a second, for a transaction that
// ran no handler, is not).
func TestAPositionRefusedAtCommitStopsThePartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	refusals := refuseAtCommit(t, e, "UPDATE ON consumer_offsets", "NEW.next_offset > 2", "23514", "position refused")
	e.produceIDs("o", 2)
	seen := &failuresSeen{}
	cfg := e.config(e.applyHandler())
	cfg.Hooks = append(cfg.Hooks, seen)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 2}, 30*time.Second)
	e.produceIDs("p", 3)
	stopped := e.stoppedWithin(30 * time.Second)
	r.stop()
	require.True(t, stopped, "the partition did not stop within 30s; Postgres refused the position's COMMIT %d times, and %d failures of good messages were reported", refusals(), seen.n.Load())
	require.ErrorContains(t, e.events.snapshot().stopped[0], "position refused")
	require.Empty(t, e.letters(), "a good message was set aside")
	require.LessOrEqual(t, seen.n.Load(), int32(1), "good messages were reported failed")
	require.Equal(t, map[int]int64{0: 2}, e.storedPositions())
}

// refuseAtCommit has Postgres refuse, at COMMIT, every transaction that
// fires on (an event on one of the consumer's tables, "INSERT ON
// dead_letters"), when the condition when holds (empty: always), raising
// text with SQLSTATE code, as a deferred check of an operator's would. It
// returns a count of the refusals so far.
func refuseAtCommit(t *testing.T, e *env, on, when, code, text string) (refusals func() int64) {
	t.Helper()
	event, table, _ := strings.Cut(on, " ON ")
	counter := e.db.Table("refusals")
	e.db.Exec(t, `CREATE SEQUENCE `+counter)
	e.db.Exec(t, `CREATE FUNCTION `+e.db.Schema+`.refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM nextval('`+counter+`'); RAISE EXCEPTION '`+text+`' USING ERRCODE = '`+code+`'; END $$`)
	if when != "" {
		when = "WHEN (" + when + ") "
	}
	e.db.Exec(t, `CREATE CONSTRAINT TRIGGER refuse AFTER `+event+` ON `+e.db.Table(table)+
		` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW `+when+`EXECUTE FUNCTION `+e.db.Schema+`.refuse()`)
	return func() int64 { return e.db.Int(t, `SELECT last_value FROM `+counter) }
}

// stoppedWithin reports whether a partition of e's consumer stopped within
// d.
func (e *env) stoppedWithin(d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if len(e.events.snapshot().stopped) > 0 {
			return true
		}
	}
	return len(e.events.snapshot().stopped) > 0
}
