package consumer_test

import (
	"context"
	"errors"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/deadletter"
)

// lyingID is a MessageID function that misbehaves by the message's value:
// it panics, fails, or returns each kind of invalid id; otherwise the key
// is the id.
func lyingID(m *consumer.Message) (string, error) {
	switch string(m.Value) {
	case "panic":
		panic("boom in the id function")
	case "err":
		return "", errors.New("no id in this one")
	case "empty":
		return "", nil
	case "long":
		return strings.Repeat("a", consumer.MaxMessageIDLen+1), nil
	case "nul":
		return "a\x00b", nil
	case "utf8":
		return "\xff\xfe", nil
	}
	return string(m.Key), nil
}

var lyingCases = []struct {
	value string
	want  string // in the letter's error text
}{
	{"panic", "MessageID function panicked: boom in the id function"},
	{"err", "no id in this one"},
	{"empty", "is empty"},
	{"long", "more than the 512 allowed"},
	{"nul", "NUL"},
	{"utf8", "not valid UTF-8"},
}

// produceLying writes, on partition p, a good message before and after each
// lying case: ok-0, <case 0>, ok-1, <case 1>, ..., ok-6. It returns the good
// ids and the offsets of the lying ones by value.
func (e *env) produceLying(p int, prefix string) (good []string, bad map[string]int64) {
	var msgs []kafka.Message
	bad = map[string]int64{}
	off := int64(0)
	for i, c := range lyingCases {
		id := prefix + "ok-" + string(rune('0'+i))
		good = append(good, id)
		msgs = append(msgs, kafka.Message{Partition: p, Key: []byte(id), Value: []byte("v-" + id)})
		off++
		msgs = append(msgs, kafka.Message{Partition: p, Key: []byte(prefix + "bad-" + c.value), Value: []byte(c.value)})
		bad[c.value] = off
		off++
	}
	last := prefix + "ok-" + string(rune('0'+len(lyingCases)))
	good = append(good, last)
	msgs = append(msgs, kafka.Message{Partition: p, Key: []byte(last), Value: []byte("v-" + last)})
	e.kafka.Produce(e.t, e.topic, msgs...)
	return good, bad
}

// A MessageID function that panics, fails or returns an invalid id sets its
// message aside with class invalid_id (the id function now runs in the
// engine, behind a conversion of the message): the letter says why, the
// dead-letter hook reports it with the consumer's types, its neighbours
// are applied once each, nothing is claimed for it, and the partition
// moves past it in the database and in Kafka.
func TestInvalidIDsFromAMisbehavingIDFunctionAreSetAside(t *testing.T) {
	t.Parallel()
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setup(t, 1)
		good, bad := e.produceLying(0, "")
		cfg := e.config(e.applyHandler())
		if batched {
			cfg.Handler, cfg.BatchHandler = nil, e.queueEffects()
		}
		cfg.MessageID = consumer.MessageIDFunc(lyingID)
		tp := withTap(cfg)
		end := int64(2*len(lyingCases) + 1)
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: end}, 30*time.Second)
		r.stop()

		e.requireExactlyOnce(good)
		require.Equal(t, map[int]int64{0: end}, e.storedPositions())
		claims := e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1"), e.name)
		require.EqualValues(t, len(good), claims, "nothing is claimed for a message without a valid id")

		letters := e.letters()
		require.Len(t, letters, len(lyingCases))
		seen := e.events.snapshot()
		require.Zero(t, len(seen.stopped))
		s := tp.snap()
		for _, c := range lyingCases {
			off := bad[c.value]
			l, ok := letters["offset:"+itoa(off)]
			require.Truef(t, ok, "a letter for %q at offset %d", c.value, off)
			require.Equal(t, deadletter.ClassInvalidID, l.Class, c.value)
			require.Empty(t, l.MessageID, c.value)
			require.Contains(t, l.Error, "invalid message id", c.value)
			require.Contains(t, l.Error, c.want, c.value)
			require.Equal(t, c.value, string(l.Value), c.value)

			d := s.deadFor(off)
			require.Lenf(t, d, 1, "one dead-letter report for %q", c.value)
			require.Equal(t, deadletter.ClassInvalidID, d[0].d.Class, c.value)
			require.Empty(t, d[0].msg.ID, c.value)
			require.ErrorIs(t, d[0].d.Err, consumer.ErrInvalidMessageID, c.value)
			var merr *consumer.MessageError
			require.Truef(t, errors.As(d[0].d.Err, &merr), "%q: %T is not a *consumer.MessageError", c.value, d[0].d.Err)
			require.Equal(t, off, merr.Offset, c.value)
			require.Equal(t, e.topic, merr.Topic, c.value)
			require.Empty(t, merr.MessageID, "an invalid id is never echoed")
		}
		for _, a := range s.applied {
			require.NotEmpty(t, a.ID)
			require.Equal(t, string(a.Key), a.ID)
		}
		require.Len(t, s.applied, len(good))
	})
}

// The same misbehaving id function under StopPartition: each partition
// stops at its first bad message, after applying the good one before it,
// with a PartitionError that errors.As finds a *consumer.MessageError in
// and errors.Is matches ErrInvalidMessageID; nothing after it is applied,
// and neither the stored position nor the Kafka offset passes it.
func TestAMisbehavingIDFunctionStopsItsPartitionUnderStopPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, len(lyingCases))
	// Partition p: a good message, then lyingCases[p], then a good one.
	var msgs []kafka.Message
	var before []string
	for p, c := range lyingCases {
		before = append(before, "before-"+c.value)
		msgs = append(msgs,
			kafka.Message{Partition: p, Key: []byte("before-" + c.value), Value: []byte("v-before")},
			kafka.Message{Partition: p, Key: []byte("bad-" + c.value), Value: []byte(c.value)},
			kafka.Message{Partition: p, Key: []byte("after-" + c.value), Value: []byte("v-after")})
	}
	e.kafka.Produce(t, e.topic, msgs...)
	cfg := e.config(e.applyHandler())
	cfg.MessageID = consumer.MessageIDFunc(lyingID)
	cfg.OnPermanentFailure = consumer.StopPartition
	tp := withTap(cfg)
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "every partition stopped", func() bool { return len(tp.snap().stopped) == len(lyingCases) })
	stopped := e.storedPositions()
	stillFor(t, 500*time.Millisecond, "a stopped partition went on", func() bool { return maps.Equal(stopped, e.storedPositions()) })
	r.stop()

	e.requireExactlyOnce(before)
	stored := e.storedPositions()
	committed := e.kafka.CommittedOffsets(t, e.group, e.topic, e.parts)
	for p := range lyingCases {
		require.EqualValuesf(t, 1, stored[p], "partition %d: the stored position stays at the bad message", p)
		require.LessOrEqualf(t, committed[p], int64(1), "partition %d: the Kafka offset is not past the bad message", p)
	}
	require.Empty(t, e.letters())
	byPart := map[int]*consumer.PartitionError{}
	for _, s := range tp.snap().stopped {
		require.Nil(t, byPart[s.Partition], "one stop per partition")
		byPart[s.Partition] = s
	}
	for p, c := range lyingCases {
		s := byPart[p]
		require.NotNil(t, s, c.value)
		require.Equal(t, e.topic, s.Topic)
		require.ErrorIs(t, s, consumer.ErrInvalidMessageID, c.value)
		var perr *consumer.PartitionError
		require.True(t, errors.As(error(s), &perr), c.value)
		var merr *consumer.MessageError
		require.Truef(t, errors.As(s, &merr), "%q: no *consumer.MessageError in %v", c.value, s)
		require.EqualValues(t, 1, merr.Offset, c.value)
		require.Equal(t, p, merr.Partition, c.value)
		require.Contains(t, s.Error(), c.want, c.value)
	}
	// The recorder installed by e.config saw the same stops.
	require.Len(t, e.events.snapshot().stopped, len(lyingCases))
}

// A letter set aside because the id function panicked, redriven while the
// function still panics, fails with an error that matches
// ErrInvalidMessageID (the redrive calls the id function through the same
// engine code as a worker, with its panic recovered), stays pending, and is
// applied once by a redrive with a fixed id function. A handler panicking
// in a redrive is a failure too, with ErrHandlerPanicked, and changes
// nothing.
func TestRedriveWithAPanickingIDFunctionOrHandler(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.kafka.Produce(t, e.topic,
		kafka.Message{Key: []byte("k-0"), Value: []byte("v-0")},
		kafka.Message{Key: []byte("k-1"), Value: []byte("panic")},
		kafka.Message{Key: []byte("k-2"), Value: []byte("v-2")})
	cfg := e.config(e.applyHandler())
	cfg.MessageID = consumer.MessageIDFunc(lyingID)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 30*time.Second)
	r.stop()
	l, ok := e.letters()["offset:1"]
	require.True(t, ok)
	require.Equal(t, deadletter.ClassInvalidID, l.Class)

	ctx := context.Background()
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	res, err := c.Redrive(ctx, consumer.RedriveFilter{})
	require.NoError(t, err)
	require.Len(t, res.Failed, 1)
	require.Equal(t, l.ID, res.Failed[0].LetterID)
	require.ErrorIs(t, res.Failed[0].Err, consumer.ErrInvalidMessageID)
	var merr *consumer.MessageError
	require.True(t, errors.As(res.Failed[0].Err, &merr), "%T", res.Failed[0].Err)
	require.EqualValues(t, 1, merr.Offset)
	require.ErrorContains(t, res.Failed[0], "panicked")
	require.Nil(t, e.letters()["offset:1"].RedrivenAt)

	// A handler that panics: the id is fine now, the handler is not.
	fixedID := consumer.MessageIDFunc(func(m *consumer.Message) (string, error) { return string(m.Key), nil })
	cfg2 := *cfg
	cfg2.MessageID = fixedID
	cfg2.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.db.Table("effects")+` (message_id, topic, partition, kafka_offset, value) VALUES ('ghost', '', 0, 0, '')`); err != nil {
			return err
		}
		panic("handler boom")
	})
	c2, err := consumer.New(e.db.Pool, &cfg2)
	require.NoError(t, err)
	res, err = c2.Redrive(ctx, consumer.RedriveFilter{})
	require.NoError(t, err)
	require.Len(t, res.Failed, 1)
	require.ErrorIs(t, res.Failed[0].Err, consumer.ErrHandlerPanicked)
	require.Zero(t, res.Applied)
	require.Nil(t, e.letters()["offset:1"].RedrivenAt)
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id = 'ghost'`), "a failed redrive writes nothing")
	require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("$1")+` AND message_id = 'k-1'`, e.name),
		"a failed redrive claims nothing")

	// Fixed for good: applied once, however often it runs.
	cfg3 := *cfg
	cfg3.MessageID = fixedID
	c3, err := consumer.New(e.db.Pool, &cfg3)
	require.NoError(t, err)
	for i := 0; i < 2; i++ {
		res, err = c3.Redrive(ctx, consumer.RedriveFilter{})
		require.NoError(t, err)
		require.Empty(t, res.Failed)
		require.Equal(t, 1-i, res.Applied, "run %d", i)
	}
	e.requireExactlyOnce([]string{"k-0", "k-1", "k-2"})
	require.NotNil(t, e.letters()["offset:1"].RedrivenAt)
	require.Equal(t, "applied", e.claimStatus("k-1"))
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// consumer.Redrive now hands its filter to the engine field by field: each
// field must select exactly its letters (a dropped HasPartition or Class
// would redrive more than asked, messages the operator meant to keep).
func TestRedriveFilterSelectsExactlyItsLetters(t *testing.T) {
	t.Parallel()
	e := setup(t, 2)
	// Partition 0: p0-perm (permanent), p0-panic (panic); partition 1:
	// p1-perm (permanent), p1-panic (panic), p1-perm2 (permanent).
	e.kafka.Produce(t, e.topic,
		msg(0, "p0-perm", "v"), msg(0, "p0-panic", "v"),
		msg(1, "p1-perm", "v"), msg(1, "p1-panic", "v"), msg(1, "p1-perm2", "v"))
	var fixed atomic.Bool
	h := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if !fixed.Load() {
			if strings.HasSuffix(m.ID, "-panic") {
				panic("boom")
			}
			return consumer.Permanent(errors.New("rejected"))
		}
		return e.applyHandler().Handle(ctx, tx, m)
	})
	cfg := e.config(h)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 2, 1: 3}, 30*time.Second)
	r.stop()
	require.Len(t, e.letters(), 5)
	fixed.Store(true)
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	ctx := context.Background()
	redriven := func() []string {
		var out []string
		for id, l := range e.letters() {
			if l.RedrivenAt != nil {
				out = append(out, id)
			}
		}
		sort.Strings(out)
		return out
	}

	res, err := c.Redrive(ctx, consumer.RedriveFilter{Topic: e.topic, Partition: 1, HasPartition: true, Class: deadletter.ClassPanic})
	require.NoError(t, err)
	require.Equal(t, consumer.RedriveResult{Applied: 1}, res)
	require.Equal(t, []string{"p1-panic"}, redriven())

	res, err = c.Redrive(ctx, consumer.RedriveFilter{Topic: e.topic, Partition: 1, HasPartition: true, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, consumer.RedriveResult{Applied: 1}, res, "Limit 1")
	require.Equal(t, []string{"p1-panic", "p1-perm"}, redriven(), "oldest first, partition 1 only")

	res, err = c.Redrive(ctx, consumer.RedriveFilter{IDs: []int64{e.letters()["p0-panic"].ID}})
	require.NoError(t, err)
	require.Equal(t, consumer.RedriveResult{Applied: 1}, res)
	require.Equal(t, []string{"p0-panic", "p1-panic", "p1-perm"}, redriven())

	res, err = c.Redrive(ctx, consumer.RedriveFilter{Topic: "no-such-topic"})
	require.NoError(t, err)
	require.Equal(t, consumer.RedriveResult{}, res)

	res, err = c.Redrive(ctx, consumer.RedriveFilter{Requested: true})
	require.NoError(t, err)
	require.Equal(t, consumer.RedriveResult{}, res, "nothing was requested")

	res, err = c.Redrive(ctx, consumer.RedriveFilter{Class: deadletter.ClassPermanent})
	require.NoError(t, err)
	require.Equal(t, consumer.RedriveResult{Applied: 2}, res)
	e.requireExactlyOnce([]string{"p0-perm", "p0-panic", "p1-perm", "p1-panic", "p1-perm2"})
}
