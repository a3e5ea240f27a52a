package consumer_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAppliesEveryMessageOnceAndCommitsOffsets(t *testing.T) {
	t.Parallel()
	e := setup(t, 3)
	ids := e.produceIDs("m", 300)

	r := e.start(e.config(e.applyHandler()))
	e.waitEffects(len(ids), 30*time.Second)
	e.waitCommitted(map[int]int64{0: 100, 1: 100, 2: 100}, 15*time.Second)
	r.stop()

	e.requireExactlyOnce(ids)
	require.Equal(t, map[int]int64{0: 100, 1: 100, 2: 100}, e.storedPositions())
	require.EqualValues(t, 300, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("processed_messages")+` WHERE `+e.db.ConsumerIs("'ledger'")+` AND status = 'applied'`))
	require.Equal(t, 300, e.events.snapshot().applied)
	e.check(expectation{ids: ids})
}
