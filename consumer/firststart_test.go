package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/offsets"
)

// When another member stores a partition's first start between this
// member's read of "no position" and its own store, the start is decided
// again from the one that stands, before any hook hears of it: one
// OnPartitionAssigned, with the Start processing really begins at. (A hook
// that keeps the first Start of each partition, as consumertest's does,
// would otherwise wait for offsets never processed.) A trigger plays the
// other member: it turns this member's first start, 0, into 4.
func TestFirstStartRedecidedFiresTheAssignedHookOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	e.produceIDs("a", 10)
	table := e.db.Table("consumer_offsets")
	fn := e.db.Table("another_member_first")
	e.db.Exec(t, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF NEW.next_offset = 0 THEN
		NEW.next_offset := 4;
	END IF;
	RETURN NEW;
END $$`)
	e.db.Exec(t, `CREATE TRIGGER another_member_first BEFORE INSERT ON `+table+` FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)

	r := e.start(e.config(e.applyHandler()))
	e.waitCommitted(map[int]int64{0: 10}, 60*time.Second)
	r.stop()
	require.EqualValues(t, 6, e.effects(), "offsets 4 to 9 applied, from the start that stood")
	assigned := e.events.snapshot().assigned
	require.Len(t, assigned, 1, "one assignment, one OnPartitionAssigned: got %+v", assigned)
	require.EqualValues(t, 4, assigned[0].Start)
	require.EqualValues(t, 4, assigned[0].StoredPosition, "decided again from the stored start")
}

// The first start marks where the consumer's processing of a partition
// began: a StartLatest consumer stopped before any message arrived has
// processed nothing, and a group rewound below that start does not reach
// before it, as it would not once a batch had committed. The messages
// before the first start are processed only when an operator moves the
// stored position (offsets.Store.Reset), and then once.
func TestAGroupRewindDoesNotReachBeforeTheFirstStart(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("old", 3)
	cfg := e.config(e.applyHandler())
	cfg.StartOffset = consumer.StartLatest
	r := e.start(cfg)
	waitFor(t, 30*time.Second, "the partition to be assigned", func() bool { return len(e.events.snapshot().assigned) > 0 })
	r.stop()
	require.Zero(t, e.effects(), "nothing processed")

	store, err := offsets.NewStore(e.db.Schema)
	require.NoError(t, err)
	ctx := context.Background()
	next, ok, err := store.Load(ctx, e.db.Pool, e.name, e.topic, 0)
	require.NoError(t, err)
	require.True(t, ok, "the partition was started: its first start is its position")
	require.EqualValues(t, 3, next)

	// kafkaonce replay --to earliest: the group rewound, the stored
	// position left alone.
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 0})
	r = e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 60*time.Second)
	r.stop()
	require.Zero(t, e.effects(), "below the first start: not the consumer's, as StartLatest chose")

	require.NoError(t, store.Reset(ctx, e.db.Pool, e.name, e.topic, 0, 0))
	e.kafka.CommitGroupOffsets(t, e.group, e.topic, map[int]int64{0: 0})
	r = e.start(cfg)
	e.waitCommitted(map[int]int64{0: 3}, 60*time.Second)
	r.stop()
	e.requireExactlyOnce(ids)
}
