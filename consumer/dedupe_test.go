package consumer_test

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/dedupe"
)

func TestProducerDuplicatesApplyOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	// Partition 0: a retrying producer wrote "a" three times in a row (one
	// batch). Partition 1 carries a copy of "b" and "c" from partition 0 (a
	// producer that re-sent to another partition).
	e.kafka.Produce(t, e.topic,
		msg(0, "a", "transfer a"), msg(0, "a", "transfer a"), msg(0, "a", "transfer a"),
		msg(0, "b", "transfer b"), msg(0, "c", "transfer c"),
	)
	r := e.start(e.config(e.applyHandler()))
	e.waitEffects(3, 30*time.Second)
	e.waitCommitted(map[int]int64{0: 5}, 15*time.Second)
	e.kafka.Produce(t, e.topic, msg(1, "b", "transfer b"), msg(1, "c", "transfer c"), msg(1, "d", "transfer d"))
	e.waitEffects(4, 30*time.Second)
	e.waitCommitted(map[int]int64{0: 5, 1: 3}, 15*time.Second)
	r.stop()

	e.requireExactlyOnce([]string{"a", "b", "c", "d"})
	ev := e.events.snapshot()
	require.Equal(t, 4, ev.applied)
	require.Equal(t, 2, ev.skipped[consumer.SkipDuplicateInBatch], "the two extra copies of a")
	require.Equal(t, 2, ev.skipped[consumer.SkipAlreadyClaimed], "b and c again on partition 1")
	require.Empty(t, ev.conflicts)
}

func TestRedeliveryIsSkippedByClaims(t *testing.T) {
	t.Parallel()
	e := setup(t, 3)
	ids := e.produceIDs("r", 150)
	r := e.start(e.config(e.applyHandler()))
	e.waitEffects(len(ids), 30*time.Second)
	e.waitCommitted(map[int]int64{0: 50, 1: 50, 2: 50}, 15*time.Second)
	r.stop()

	// Lose the stored positions (as if written by an older version) and
	// rewind the group: every message is delivered again, and only the
	// processed_messages claims stand between it and a second effect.
	e.db.Exec(t, `DELETE FROM `+e.db.Table("consumer_offsets"))
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 0, 1: 0, 2: 0})
	before := e.events.snapshot()

	r = e.start(e.config(e.applyHandler()))
	waitFor(t, 30*time.Second, "positions restored", func() bool {
		p := e.storedPositions()
		return p[0] == 50 && p[1] == 50 && p[2] == 50
	})
	r.stop()

	e.requireExactlyOnce(ids)
	after := e.events.snapshot()
	require.Equal(t, before.applied, after.applied, "no message applied on redelivery")
	require.Equal(t, 150, after.skipped[consumer.SkipAlreadyClaimed]-before.skipped[consumer.SkipAlreadyClaimed])
	e.check(expectation{ids: ids})
}

func TestRewindToEarliestAppliesNothingNew(t *testing.T) {
	t.Parallel()
	e := setup(t, 3)
	ids := e.produceIDs("w", 90)
	r := e.start(e.config(e.applyHandler()))
	e.waitEffects(len(ids), 30*time.Second)
	e.waitCommitted(map[int]int64{0: 30, 1: 30, 2: 30}, 15*time.Second)
	r.stop()

	// Prune every claim too: after a rewind, the stored positions alone
	// must keep the old messages from being applied again.
	e.db.Exec(t, `DELETE FROM `+e.db.Table("processed_messages"))
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 0, 1: 0, 2: 0})
	more := e.produceIDs("w2", 9)

	r = e.start(e.config(e.applyHandler()))
	e.waitEffects(len(ids)+len(more), 30*time.Second)
	e.waitCommitted(map[int]int64{0: 33, 1: 33, 2: 33}, 15*time.Second)
	r.stop()

	e.requireExactlyOnce(append(ids, more...))
	var rewound int
	for _, a := range e.events.snapshot().assigned {
		if a.KafkaOffset == 0 && a.StoredPosition == 30 {
			require.EqualValues(t, 30, a.Start, "a rewound partition starts at the stored position")
			rewound++
		}
	}
	require.Equal(t, 3, rewound, "all three partitions were assigned rewound")
}

func TestTwoMembersClaimingTheSameIDsAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	ids := e.produceIDs("x", 400)

	// Two consumers with the same Name (one dedupe scope) in two different
	// groups: both receive every message. A barrier before their first
	// transaction makes them claim the same batch at the same moment; after
	// that they race freely.
	barrier := newBarrier(2)
	a := e.config(e.applyHandler())
	a.MaxBatch = 20
	a.Hooks = append(a.Hooks, barrier)
	b := e.config(e.applyHandler())
	b.MaxBatch = 20
	b.GroupID = e.group + "_b"
	other := &recorder{}
	b.Hooks = []consumer.Hook{other, barrier}

	ra := e.start(a)
	rb := e.start(b)
	// Both groups through the topic. (A member may also start past messages
	// the other already processed: the stored position is shared by Name.)
	e.waitCommitted(map[int]int64{0: 200, 1: 200}, 60*time.Second)
	waitFor(t, 60*time.Second, "group b through the topic", func() bool {
		got := e.kafka.CommittedOffsets(t, b.GroupID, e.topic, 2)
		return got[0] == 200 && got[1] == 200
	})
	ra.stop()
	rb.stop()

	require.True(t, barrier.met(), "both members held a batch at the same time")
	e.requireExactlyOnce(ids)
	ea, eb := e.events.snapshot(), other.snapshot()
	require.Equal(t, len(ids), ea.applied+eb.applied, "each id applied by exactly one member")
	require.Positive(t, ea.skipped[consumer.SkipAlreadyClaimed]+eb.skipped[consumer.SkipAlreadyClaimed], "the members did collide on claims")
	t.Logf("member a applied %d, member b applied %d; %d+%d collisions", ea.applied, eb.applied,
		ea.skipped[consumer.SkipAlreadyClaimed], eb.skipped[consumer.SkipAlreadyClaimed])
	e.check(expectation{ids: ids})
}

// barrier holds the first batch of each of n members until all n have one.
type barrier struct {
	mu      sync.Mutex
	waiting int
	n       int
	all     chan struct{}
	ok      bool
}

func newBarrier(n int) *barrier { return &barrier{n: n, all: make(chan struct{})} }

func (b *barrier) OnBatchStart(ctx context.Context, info consumer.BatchInfo) {
	b.mu.Lock()
	if b.waiting >= b.n {
		b.mu.Unlock()
		return
	}
	b.waiting++
	if b.waiting == b.n {
		b.ok = true
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
	case <-time.After(20 * time.Second):
	}
}

func (b *barrier) met() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ok
}

func TestSameIDWithDifferentContentStopsThePartitionUnderStopPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	// Partition 0: both versions in one batch. Partition 1: the second
	// version arrives after the first was committed.
	e.kafka.Produce(t, e.topic,
		msg(0, "p0-before", "ok"), msg(0, "dup0", "amount=10"), msg(0, "dup0", "amount=99"), msg(0, "p0-after", "ok"),
		msg(1, "dup1", "amount=10"),
	)
	cfg := e.config(e.applyHandler())
	cfg.OnPermanentFailure = consumer.StopPartition
	r := e.start(cfg)
	e.waitEffects(3, 30*time.Second)
	e.kafka.Produce(t, e.topic, msg(1, "dup1", "amount=77"), msg(1, "p1-after", "ok"))

	waitFor(t, 30*time.Second, "both partitions stopped", func() bool { return len(e.events.snapshot().stopped) == 2 })
	// The messages before each conflict are committed, Kafka offsets included.
	e.waitCommitted(map[int]int64{0: 2, 1: 1}, 15*time.Second)
	r.stop()

	e.requireExactlyOnce([]string{"p0-before", "dup0", "dup1"})
	require.Equal(t, "amount=10", e.effectValue("dup0"), "the first version stands")
	require.Equal(t, "amount=10", e.effectValue("dup1"))

	ev := e.events.snapshot()
	require.Len(t, ev.conflicts, 2)
	byPartition := map[int]*consumer.FingerprintConflictError{}
	for _, c := range ev.conflicts {
		byPartition[c.Partition] = c
		require.ErrorIs(t, c, consumer.ErrFingerprintConflict)
		require.Contains(t, c.Error(), "fix the producer")
	}
	require.EqualValues(t, 2, byPartition[0].Offset)
	require.EqualValues(t, 1, byPartition[0].Existing.Offset, "in-batch: points at the first copy")
	require.EqualValues(t, 1, byPartition[1].Offset)
	require.EqualValues(t, 0, byPartition[1].Existing.Offset)
	require.Equal(t, "applied", string(byPartition[1].Existing.Status))
	for _, s := range ev.stopped {
		require.ErrorIs(t, s, consumer.ErrFingerprintConflict)
	}
	require.Equal(t, map[int]int64{0: 2, 1: 1}, e.storedPositions(), "nothing past a conflict is recorded as processed")
}

func TestInvalidMessageIDsStopThePartitionUnderStopPartition(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		header []byte // nil: no header at all
		want   string
	}{
		{"missing", nil, `no "message-id" header`},
		{"empty", []byte{}, "is empty"},
		{"too long", make([]byte, consumer.MaxMessageIDLen+1), "more than the 512 allowed"},
		{"nul", []byte("ab\x00cd"), "NUL"},
		{"invalid utf8", []byte{0xff, 0xfe, 'x'}, "not valid UTF-8"},
	}
	e := setup(t, len(cases))
	for i := range cases[2].header {
		cases[2].header[i] = 'a'
	}
	var msgs []kafka.Message
	for p, c := range cases {
		bad := kafka.Message{Partition: p, Value: []byte("bad")}
		if c.header != nil {
			bad.Headers = []kafka.Header{{Key: consumer.DefaultMessageIDHeader, Value: c.header}}
		}
		msgs = append(msgs, msg(p, c.name+"-before", "ok"), bad, msg(p, c.name+"-after", "ok"))
	}
	e.kafka.Produce(t, e.topic, msgs...)

	cfg := e.config(e.applyHandler())
	cfg.OnPermanentFailure = consumer.StopPartition
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "every partition stopped", func() bool { return len(e.events.snapshot().stopped) == len(cases) })
	r.stop()

	var before []string
	for _, c := range cases {
		before = append(before, c.name+"-before")
	}
	e.requireExactlyOnce(before)
	stopped := map[int]*consumer.PartitionError{}
	for _, s := range e.events.snapshot().stopped {
		stopped[s.Partition] = s
	}
	for p, c := range cases {
		s := stopped[p]
		require.NotNil(t, s, c.name)
		require.ErrorIs(t, s, consumer.ErrInvalidMessageID, c.name)
		var merr *consumer.MessageError
		require.True(t, errors.As(s, &merr), c.name)
		require.EqualValues(t, 1, merr.Offset, c.name)
		require.Contains(t, s.Error(), c.want, c.name)
		require.Contains(t, s.Error(), e.topic+"/"+string(rune('0'+p))+"/1", c.name)
	}
}

func (e *env) effectValue(id string) string {
	var v string
	require.NoError(e.t, e.db.Pool.QueryRow(context.Background(), `SELECT value FROM `+e.db.Table("effects")+` WHERE message_id = $1`, id).Scan(&v))
	return v
}

// Message ids may hold any character but NUL. The claim of a batch packs
// its ids into one parameter, split on newlines by the server; a batch with
// an id holding a newline is claimed as arrays instead. Both ways must
// store each id, offset and fingerprint exactly, and find the claims again
// when the messages are delivered a second time.
func TestIDsWithAnyCharacterAreClaimedExactly(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	packable := []string{"a,b", `{"x"}`, `back\slash`, "tab\there", " spaced ", "ünïcødé 日本", "NULL", "'q'", "cr\rlf", strings.Repeat("x", consumer.MaxMessageIDLen)}
	withNewline := []string{"line\nbreak", "plain", "\n", "ends\n"}
	produce := func(ids []string) {
		msgs := make([]kafka.Message, len(ids))
		for i, id := range ids {
			msgs[i] = msg(0, id, "v "+id)
		}
		e.kafka.Produce(t, e.topic, msgs...)
	}
	r := e.start(e.config(e.applyHandler()))
	produce(packable)
	e.waitCommitted(map[int]int64{0: int64(len(packable))}, 30*time.Second)
	produce(withNewline)
	all := append(append([]string{}, packable...), withNewline...)
	e.waitCommitted(map[int]int64{0: int64(len(all))}, 30*time.Second)
	r.stop()
	e.requireExactlyOnce(all)

	type claimRow struct {
		ID          string `db:"message_id"`
		Offset      int64  `db:"kafka_offset"`
		Fingerprint []byte `db:"fingerprint"`
	}
	rows, _ := e.db.Pool.Query(context.Background(), `SELECT message_id, kafka_offset, fingerprint FROM `+e.db.Table("processed_messages"))
	claimRows, err := pgx.CollectRows(rows, pgx.RowToStructByName[claimRow])
	require.NoError(t, err)
	stored := map[string]int64{}
	for _, c := range claimRows {
		require.Equal(t, dedupe.FingerprintOf([]byte(c.ID), []byte("v "+c.ID)).String(), hex.EncodeToString(c.Fingerprint), "fingerprint of %q", c.ID)
		stored[c.ID] = c.Offset
	}
	require.Len(t, stored, len(all))
	for i, id := range all {
		require.EqualValues(t, i, stored[id], "offset of %q", id)
	}

	// Delivered again without the stored position: only the claims keep
	// the messages from being applied twice.
	e.db.Exec(t, `DELETE FROM `+e.db.Table("consumer_offsets"))
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 0})
	before := e.events.snapshot()
	r = e.start(e.config(e.applyHandler()))
	waitFor(t, 30*time.Second, "position restored", func() bool { return e.storedPositions()[0] == int64(len(all)) })
	r.stop()
	e.requireExactlyOnce(all)
	after := e.events.snapshot()
	require.Equal(t, len(all), after.skipped[consumer.SkipAlreadyClaimed]-before.skipped[consumer.SkipAlreadyClaimed])
}

// A conflict behind where a savepoint transaction was cut is not set aside
// by that transaction: it is reported once, by the transaction that sets
// it aside.
func TestAConflictBehindACutTransactionIsReportedOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.kafka.Produce(t, e.topic, msg(0, "dup", "first content"))
	apply := e.applyHandler()
	var flaked bool
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		switch {
		case m.ID == "a-0":
			return consumer.Permanent(errors.New("poison")) // savepoints from here on
		case m.ID == "a-1" && !flaked:
			flaked = true
			return errors.New("flaky") // cuts the savepoint transaction at a-1
		}
		return apply.Handle(ctx, tx, m)
	})
	r := e.start(e.config(h))
	e.waitCommitted(map[int]int64{0: 1}, 30*time.Second)
	e.kafka.Produce(t, e.topic, msg(0, "a-0", "v"), msg(0, "a-1", "v"), msg(0, "dup", "other content"))
	e.waitCommitted(map[int]int64{0: 4}, 30*time.Second)
	r.stop()
	require.Len(t, e.letters(), 2, "a-0 and the conflicting dup")
	require.Len(t, e.events.snapshot().conflicts, 1, "the conflict is reported once, when its message is set aside")
}
