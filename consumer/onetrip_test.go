package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

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

	ids := e.produceIDs("o", 100)
	// The COMMIT at the end of the one pipeline reaches the server, which
	// commits; the connection is cut before the reply gets back. The batch
	// runs again: its one-trip claims fail on the ids now taken, and the
	// ordinary path finds every message already applied.
	errs := &batchErrors{}
	cfg := batchConfig(e, &batchEffects{e: e})
	cfg.MaxBatch = 20
	cfg.Hooks = append(cfg.Hooks, errs, armOnBatch{proxy: proxy, n: 2, batches: &atomic.Int32{}})
	r := e.start(cfg, e.db.PoolVia(t, proxy.Addr()))
	e.waitCommitted(map[int]int64{0: 100}, 30*time.Second)
	r.stop()

	require.EqualValues(t, 1, proxy.Dropped(), "the fault was injected")
	require.Equal(t, 1, errs.containing("commit outcome unknown"), "the lost reply was seen as an unknown outcome")
	e.requireExactlyOnce(ids)
	require.Equal(t, 100, e.events.snapshot().applied+e.events.snapshot().skipped[consumer.SkipAlreadyClaimed])
	require.Equal(t, map[int]int64{0: 100}, e.storedPositions())
	e.check(expectation{ids: ids})
}

// A database restored to an earlier state has lost committed transactions:
// their effects, claims and positions together. A one-trip batch must not
// move the position past the lost messages (nothing is read back before its
// COMMIT): the position check in its pipeline fails, and the ordinary path
// processes the lost messages again.
func TestOneTripStopsAtALostPosition(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	ids := e.produceIDs("p", 100)
	cfg := batchConfig(e, &batchEffects{e: e})
	cfg.MaxBatch = 20
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 100}, 30*time.Second)

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
