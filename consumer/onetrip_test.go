package consumer_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
)

// The tests of batches sent in one round trip (a BatchHandler that only
// queues): the hard cases of the ordinary path, met on this one.

// armOnBatch makes the proxy drop the reply to the next COMMIT when batch n
// (counting from 1) starts. The first batch of a partition claims first (its
// stored position is not known yet); later ones go in one round trip.
type armOnBatch struct {
	proxy   *faultproxy.Proxy
	n       int32
	batches *atomic.Int32
}

func (a armOnBatch) OnBatchStart(context.Context, consumer.BatchInfo) {
	if a.batches.Add(1) == a.n {
		a.proxy.DropAfterCommits(1)
	}
}

func TestOneTripCommitReplyLostAppliesOnce(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	proxy, err := faultproxy.Start(e.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })

	// The COMMIT at the end of the one pipeline reaches the server, which
	// commits; the connection is cut before the reply gets back. The batch
	// runs again: its one-trip claims fail on the ids now taken, and the
	// ordinary path finds every message already applied.
	errs := &batchErrors{}
	cfg := batchConfig(e, &batchEffects{e: e})
	cfg.MaxBatch = 20
	cfg.Hooks = append(cfg.Hooks, errs, armOnBatch{proxy: proxy, n: 2, batches: &atomic.Int32{}})
	r := e.start(cfg, e.db.PoolVia(t, proxy.Addr()))
	e.waitRecorded() // its COMMIT is not the one to drop
	ids := e.produceIDs("o", 100)
	e.waitCommitted(map[int]int64{0: 100}, 30*time.Second)
	r.stop()

	require.EqualValues(t, 1, proxy.Dropped(), "the fault was injected")
	require.Equal(t, 1, errs.containing("commit outcome unknown"), "the lost reply was seen as an unknown outcome")
	e.requireExactlyOnce(ids)
	require.Equal(t, 100, e.events.snapshot().applied+e.events.snapshot().skipped[consumer.SkipAlreadyClaimed])
	require.Equal(t, map[int]int64{0: 100}, e.storedPositions())
	e.check(expectation{ids: ids})
}

// processedOneTrip starts a consumer with a queueing BatchHandler (batches
// of 20) on a new one-partition topic of n messages, and waits until they
// are all committed: the stored position is then known, and the next
// batches go in one round trip.
func processedOneTrip(t *testing.T, prefix string, n int) (*env, []string, *running) {
	e := setup(t, 1)
	ids := e.produceIDs(prefix, n)
	cfg := batchConfig(e, &batchEffects{e: e})
	cfg.MaxBatch = 20
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: int64(n)}, 30*time.Second)
	return e, ids, r
}

// A database restored to an earlier state has lost committed transactions:
// their effects, claims and positions together. A one-trip batch must not
// move the position past the lost messages (nothing is read back before its
// COMMIT): the position check in its pipeline fails, and the ordinary path
// processes the lost messages again.
func TestOneTripStopsAtALostPosition(t *testing.T) {
	t.Parallel()
	e, ids, r := processedOneTrip(t, "p", 100)

	// "Restore": everything from offset 60 on is gone from the database.
	e.db.Exec(t, `DELETE FROM `+e.db.Table("effects")+` WHERE kafka_offset >= 60`)
	e.db.Exec(t, `DELETE FROM `+e.db.Table("processed_messages")+` WHERE kafka_offset >= 60`)
	e.db.Exec(t, `UPDATE `+e.db.Table("consumer_offsets")+` SET next_offset = 60`)

	more := e.produceIDs("q", 100)
	waitFor(t, 30*time.Second, "all 200 messages applied", func() bool { return e.effects() >= 200 })
	e.waitCommitted(map[int]int64{0: 200}, 30*time.Second)
	r.stop()

	e.requireExactlyOnce(append(ids, more...))
	require.Equal(t, map[int]int64{0: 200}, e.storedPositions())
}

// Duplicates the worker can foresee cost no extra round trip: a re-send of
// a message it committed (the same id and content) and a repeat within the
// batch are skipped without a claim, the handler never sees them, and the
// batch still goes in one round trip (the database checks the re-sends in
// the same pipeline).
func TestOneTripSkipsForeseenDuplicates(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	rt := &roundTrips{}
	pool := e.db.PoolVia(t, e.db.ServerAddr(t), func(cfg *pgxpool.Config) { cfg.ConnConfig.DialFunc = rt.dial })
	ids := e.produceIDs("f", 100)
	h := &batchEffects{e: e}
	cfg := batchConfig(e, h)
	cfg.MaxBatch = 20
	counts := &perBatch{rt: rt}
	cfg.Hooks = append(cfg.Hooks, counts)
	r := e.start(cfg, pool)
	e.waitCommitted(map[int]int64{0: 100}, 30*time.Second)
	counts.mu.Lock()
	before := len(counts.counts)
	counts.mu.Unlock()

	// New messages with re-sends of committed ones between them, and one
	// new message sent twice in a row.
	var again []kafka.Message
	for i := 0; i < 20; i++ {
		again = append(again, msg(0, "g-"+strconv.Itoa(i), "v-g-"+strconv.Itoa(i)), msg(0, ids[i*5], "v-"+ids[i*5]))
		ids = append(ids, "g-"+strconv.Itoa(i))
	}
	again = append(again, msg(0, "g-twice", "v-g-twice"), msg(0, "g-twice", "v-g-twice"))
	ids = append(ids, "g-twice")
	e.kafka.Produce(t, e.topic, again...)
	e.waitCommitted(map[int]int64{0: 142}, 30*time.Second)
	r.stop()

	e.requireExactlyOnce(ids)
	e.check(expectation{ids: ids})
	h.mu.Lock()
	for id, n := range h.seenIDs {
		require.Equalf(t, 1, n, "message %s was passed to the handler once", id)
	}
	h.mu.Unlock()
	skipped := e.events.snapshot().skipped
	require.Equal(t, 21, skipped[consumer.SkipAlreadyClaimed]+skipped[consumer.SkipDuplicateInBatch], "skipped: %v", skipped)
	// One round trip per batch, and one more the first time the check of
	// re-sends is sent (pgx prepares a statement new to the connection).
	// Claiming first, each batch holding a re-send would take three.
	counts.mu.Lock()
	defer counts.mu.Unlock()
	after := counts.counts[before:]
	var sum int64
	for _, n := range after {
		sum += n
	}
	require.NotEmpty(t, after)
	require.LessOrEqualf(t, sum, int64(len(after)+1), "round trips of the batches holding re-sends: %v", after)
}

// What the worker remembers only predicts: the database decides. A
// message re-sent after its claim was deleted (pruned) is applied again,
// and one whose id is now claimed with other content is a conflict; taking
// either for a plain re-send from memory would skip it silently.
func TestOneTripForeseenDuplicatesAreCheckedByTheDatabase(t *testing.T) {
	t.Parallel()
	e, ids, r := processedOneTrip(t, "d", 40)

	claims := e.db.Table("processed_messages")
	e.db.Exec(t, `DELETE FROM `+claims+` WHERE message_id = $1`, ids[3])
	e.db.Exec(t, `UPDATE `+claims+` SET fingerprint = sha256('other content') WHERE message_id = $1`, ids[5])
	e.kafka.Produce(t, e.topic, msg(0, "n-0", "v-n-0"), msg(0, ids[3], "v-"+ids[3]), msg(0, ids[5], "v-"+ids[5]), msg(0, "n-1", "v-n-1"))
	e.waitCommitted(map[int]int64{0: 44}, 30*time.Second)
	r.stop()

	count := func(id string) int64 {
		return e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("effects")+` WHERE message_id = $1`, id)
	}
	require.EqualValues(t, 2, count(ids[3]), "a re-send whose claim is gone is applied again")
	require.EqualValues(t, 1, count(ids[5]), "a re-send whose id holds other content is not applied")
	require.EqualValues(t, 1, count("n-0"))
	require.EqualValues(t, 1, count("n-1"))
	conflicts := e.events.snapshot().conflicts
	require.Len(t, conflicts, 1)
	require.Equal(t, ids[5], conflicts[0].MessageID)
}
