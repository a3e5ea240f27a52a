package consumer_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/commitmark"
	"github.com/kafkaonce/kafkaonce/internal/schema"
)

// A partition without a stored position adopts the group's committed
// offset, unless that offset says it was committed by this consumer
// against a position this database stored: then the database lost the
// partition's rows (a restore from a backup taken before the partition's
// first start, a row deleted), and with them the effects of the messages
// below the group offset. Those are processed again, from the first start
// the offset's mark names, and the claims decide what is a duplicate.
func TestAPositionLostBeforeTheFirstStartIsProcessedAgain(t *testing.T) {
	t.Parallel()
	t.Run("a restore to before the first start applies every message again, once", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("m", 10)
		cfg := e.config(e.applyHandler())
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 10}, 60*time.Second)
		r.stop()
		m, ok := commitmark.Parse(e.kafka.CommittedMetadata(t, e.group, e.topic, 0))
		require.True(t, ok, "the group offset carries kafkaonce's mark")
		require.Equal(t, commitmark.Mark{Store: e.storeID(), Consumer: e.name, First: 0}, m)

		ids = append(ids, e.produceMore("m", 10, 5)...)
		e.restoreToBeforeTheFirstStart()
		r = e.start(cfg)
		e.waitCommitted(map[int]int64{0: 15}, 60*time.Second)
		r.stop()
		e.requireExactlyOnce(ids)
		require.EqualValues(t, 15, e.storedPositions()[0])
	})
	t.Run("a deleted row is found the same way, and the claims skip what was applied", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("m", 10)
		cfg := e.config(e.applyHandler())
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 10}, 60*time.Second)
		r.stop()
		ids = append(ids, e.produceMore("m", 10, 5)...)
		e.db.Exec(t, `DELETE FROM `+e.db.Table("consumer_offsets")+` WHERE consumer = $1`, e.name)
		before := e.events.snapshot()
		r = e.start(cfg)
		e.waitCommitted(map[int]int64{0: 15}, 60*time.Second)
		r.stop()
		e.requireExactlyOnce(ids)
		after := e.events.snapshot()
		require.Equal(t, 10, after.skipped[consumer.SkipAlreadyClaimed]-before.skipped[consumer.SkipAlreadyClaimed],
			"read again from the first start: the claims skip the first ten")
	})
	t.Run("under StartLatest, again from the first start, not from the log's", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("old", 3)
		cfg := e.config(e.applyHandler())
		cfg.StartOffset = consumer.StartLatest
		r := e.start(cfg)
		waitFor(t, 30*time.Second, "the first start stored", func() bool { return e.storedPositions()[0] == 3 })
		ids := e.produceMore("new", 0, 10)
		e.waitCommitted(map[int]int64{0: 13}, 60*time.Second)
		r.stop()

		e.restoreToBeforeTheFirstStart()
		r = e.start(cfg)
		e.waitCommitted(map[int]int64{0: 13}, 60*time.Second)
		waitFor(t, 30*time.Second, "the position stored again", func() bool { return e.storedPositions()[0] == 13 })
		r.stop()
		e.requireExactlyOnce(ids) // and none of the three before the first start
	})
	t.Run("under StartLatest on an empty log, the first start 0 is marked before any message, and a restore passes over nothing", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		cfg := e.config(e.applyHandler())
		cfg.StartOffset = consumer.StartLatest
		r := e.start(cfg)
		want := commitmark.Mark{Store: e.storeID(), Consumer: e.name, First: 0}.String()
		waitFor(t, 30*time.Second, "the member in its group", func() bool {
			state, err := e.kafka.GroupState(e.group)
			return err == nil && state == "Stable"
		})
		waitFor(t, 30*time.Second, "the first start, 0, committed with the mark", func() bool {
			return e.kafka.CommittedMetadata(t, e.group, e.topic, 0) == want
		})
		r.stop()

		// Produced while the consumer is down, then the database is
		// restored to before its first start: the group's offset is all
		// that says these messages came after it.
		ids := e.produceMore("m", 0, 5)
		e.restoreToBeforeTheFirstStart()
		r = e.start(cfg)
		e.waitCommitted(map[int]int64{0: 5}, 60*time.Second)
		r.stop()
		e.requireExactlyOnce(ids)
	})
	t.Run("a position stored before offsets carried the mark is marked at the next start, even idle", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		cfg := e.config(e.applyHandler())
		ids, r := e.markedWithoutAFirstStart(cfg)
		r.stop()
		// The first start is not known: a lost row is processed from the
		// log's start, here the first start too.
		ids = append(ids, e.produceMore("m", 10, 5)...)
		e.restoreToBeforeTheFirstStart()
		r = e.start(cfg)
		e.waitCommitted(map[int]int64{0: 15}, 60*time.Second)
		r.stop()
		e.requireExactlyOnce(ids)
	})
	t.Run("a lost row found mid-run without a known first start is processed from the log's start", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids, r := e.markedWithoutAFirstStart(e.config(e.applyHandler()))
		// The database is restored, under the running consumer, to a
		// backup taken before the partition's first start: the next batch
		// finds the row gone, and the run's own start (10) would pass over
		// what the restore rolled back.
		e.restoreToBeforeTheFirstStart()
		ids = append(ids, e.produceMore("m", 10, 5)...)
		e.waitCommitted(map[int]int64{0: 15}, 60*time.Second)
		waitFor(t, 30*time.Second, "the position stored again", func() bool { return e.storedPositions()[0] == 15 })
		r.stop()
		require.Empty(t, e.events.snapshot().stopped)
		e.requireExactlyOnce(ids)
	})
	t.Run("a first start that retention deleted meanwhile stops the partition, naming the offsets", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		e.produceIDs("m", 10)
		cfg := e.config(e.applyHandler())
		r := e.start(cfg)
		e.waitCommitted(map[int]int64{0: 10}, 60*time.Second)
		r.stop()
		e.restoreToBeforeTheFirstStart()
		e.kafka.DeleteRecordsBefore(t, e.topic, 0, 4)
		r = e.start(cfg)
		waitFor(t, 30*time.Second, "the partition to stop", func() bool { return len(e.events.snapshot().stopped) > 0 })
		r.stop()
		var gone *consumer.MessagesDeletedError
		require.True(t, errors.As(e.events.snapshot().stopped[0], &gone), "stopped with %v", e.events.snapshot().stopped[0])
		require.EqualValues(t, 0, gone.From)
		require.EqualValues(t, 3, gone.To)
		require.Zero(t, e.effects(), "nothing after the loss is applied before an operator accepts it")
	})
}

// A group offset that this consumer did not commit against this database
// says nothing of what the database lost: a partition without a stored
// position adopts it, as it always did, whoever committed it.
func TestAGroupOffsetNotCommittedAgainstThisStoreIsAdopted(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		metadata func(e *env) string
	}{
		{"no mark: another client, or an operator's reset", func(*env) string { return "" }},
		{"another client's metadata", func(*env) string { return "member-1-4f2c" }},
		{"the mark of another database", func(e *env) string {
			return commitmark.Mark{Store: "00000000-0000-0000-0000-000000000001", Consumer: e.name, First: 0}.String()
		}},
		{"the mark of another consumer of this database", func(e *env) string {
			return commitmark.Mark{Store: e.storeID(), Consumer: "renamed-" + e.name, First: 0}.String()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			ids := e.produceIDs("m", 15)
			e.kafka.CommitGroupOffsetsWithMetadata(t, e.group, e.topic, map[int]int64{0: 10}, tc.metadata(e))
			r := e.start(e.config(e.applyHandler()))
			e.waitCommitted(map[int]int64{0: 15}, 60*time.Second)
			r.stop()
			e.requireExactlyOnce(ids[10:])
			m, ok := commitmark.Parse(e.kafka.CommittedMetadata(t, e.group, e.topic, 0))
			require.True(t, ok, "the consumer's own commits carry its mark")
			require.Equal(t, commitmark.Mark{Store: e.storeID(), Consumer: e.name, First: 10}, m, "the adopted offset is the first start")
		})
	}
}

// storeID is the id of the test's store.
func (e *env) storeID() string {
	e.t.Helper()
	id, err := schema.StoreID(context.Background(), e.db.Pool, e.db.Schema)
	require.NoError(e.t, err)
	return id
}

// produceMore writes n messages to partition 0, ids "<prefix>-from" on.
func (e *env) produceMore(prefix string, from, n int) []string {
	e.t.Helper()
	ids := make([]string, 0, n)
	for i := from; i < from+n; i++ {
		id := prefix + "-" + strconv.Itoa(i)
		ids = append(ids, id)
		e.kafka.Produce(e.t, e.topic, msg(0, id, "v-"+id))
	}
	return ids
}

// restoreToBeforeTheFirstStart does to the database what a restore from a
// backup taken before the consumer first started does: everything the
// consumer wrote is gone, with the effects, in one transaction; the
// store's identity, older than the backup, stays.
func (e *env) restoreToBeforeTheFirstStart() {
	e.t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		for _, table := range schema.ConsumerTables {
			if _, err := tx.Exec(ctx, `DELETE FROM `+e.db.Table(table)+` WHERE consumer = $1`, e.name); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+e.db.Table("processed_messages")+` WHERE consumer_id = (SELECT id FROM `+e.db.Table("consumers")+` WHERE name = $1)`, e.name); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+e.db.Table("consumers")+` WHERE name = $1`, e.name); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `TRUNCATE `+e.db.Table("effects"))
		return err
	})
	require.NoError(e.t, err)
	require.Zero(e.t, e.effects())
	require.Empty(e.t, e.storedPositions())
}

// markedWithoutAFirstStart processes ten messages, commits the group's
// offset again without the mark (as a kafkaonce older than the mark left
// it), and starts a consumer, which marks it with its first start
// unknown; it returns the ids and the running consumer.
func (e *env) markedWithoutAFirstStart(cfg *consumer.Config) ([]string, *running) {
	t := e.t
	ids := e.produceIDs("m", 10)
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 10}, 60*time.Second)
	r.stop()
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 10})
	r = e.start(cfg)
	waitFor(t, 30*time.Second, "the group offset marked again, first start unknown", func() bool {
		m, ok := commitmark.Parse(e.kafka.CommittedMetadata(t, e.group, e.topic, 0))
		return ok && m == commitmark.Mark{Store: e.storeID(), Consumer: e.name, First: -1}
	})
	return ids, r
}
