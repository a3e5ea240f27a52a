package consumer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// A pause of one partition stops a share group member's polling
// altogether: it acquires nothing, so no record's delivery is spent and
// none is skipped, and on resume every record is applied once, on its
// first delivery.
func TestShareGroupPausedPollsNothing(t *testing.T) {
	e := setupShare(t, shareOptions{})
	ctx := testenv.Context(t, time.Minute)
	cfg := e.shareConfig(false, nil)
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	require.NoError(t, c.Pause(ctx, pauses.Partition(e.topic, 0), "share pause test"))
	e.run(c)
	ids := e.produceIDs("p", 5)
	stillFor(t, 3*shareLock, "nothing applied while paused", func() bool { return e.effects() == 0 })
	for _, id := range ids {
		require.Zero(t, e.callsOf(id), "no handler call while paused")
	}

	require.NoError(t, c.Resume(ctx, pauses.Partition(e.topic, 0)))
	e.waitEffects(len(ids), 30*time.Second)
	e.requireExactlyOnce(ids)
	for _, id := range ids {
		require.Equal(t, 1, e.callsOf(id), "one call each: no delivery spent, none skipped")
	}
}
