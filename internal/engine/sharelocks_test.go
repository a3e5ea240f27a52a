package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// Health shows what a share member holds: the records of its last poll
// not settled yet, and those of them on their last delivery, from the
// poll until each is settled, and nothing once the rest is released.
func TestShareLocksShowWhatTheMemberHolds(t *testing.T) {
	s, _ := shareEvents(&fakeShare{})
	s.settings.DeliveryLimit = 3
	rec := func(offset int64, delivery int) kafkaclient.ShareRecord {
		id := shareRec
		id.Offset = offset
		return kafkaclient.ShareRecord{RecordID: id, DeliveryCount: delivery, LockedUntil: time.Now().Add(time.Minute)}
	}
	recs := []kafkaclient.ShareRecord{rec(1, 1), rec(2, 3), rec(3, 2), rec(4, 3)}
	held := func() [2]int64 { return [2]int64{s.health.shareHeld.Load(), s.health.shareLast.Load()} }

	s.locks.hold(t.Context(), recs)
	require.Equal(t, [2]int64{4, 2}, held(), "four held, two on their last delivery")
	s.locks.settle(t.Context(), kafkaclient.Accept, recs[0].RecordID, recs[1].RecordID)
	require.Equal(t, [2]int64{2, 1}, held(), "the accepted ones are no longer held")
	s.locks.settle(t.Context(), kafkaclient.Reject, recs[3].RecordID)
	require.Equal(t, [2]int64{1, 0}, held())
	s.locks.releaseRest(t.Context())
	require.Equal(t, [2]int64{0, 0}, held(), "released, nothing held")
}
