package consumer_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// shareEventLog records a consumer's share events.
type shareEventLog struct {
	mu     sync.Mutex
	byKind map[consumer.ShareEventKind]map[int64]int
}

func (l *shareEventLog) OnShareEvent(_ context.Context, e consumer.ShareEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byKind == nil {
		l.byKind = map[consumer.ShareEventKind]map[int64]int{}
	}
	if l.byKind[e.Kind] == nil {
		l.byKind[e.Kind] = map[int64]int{}
	}
	l.byKind[e.Kind][e.Offset]++
}

// offsets returns how often each offset was reported with kind.
func (l *shareEventLog) offsets(kind consumer.ShareEventKind) map[int64]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int64]int{}
	for off, n := range l.byKind[kind] {
		out[off] = n
	}
	return out
}

// HookShareEvent reports each provisional letter written before a
// record's last delivery, and its removal by the transaction that settles
// the record, applied or set aside: every record is delivered once and
// released first, so that under a delivery limit of 2 each is on its
// last delivery, and each is reported once of each.
func TestShareGroupReportsProvisionalLetters(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{deliveryLimit: 2})
		ids := e.produceIDs("m", 10)
		e.deliverAndRelease(len(ids))
		var poison string
		cfg := e.shareConfig(batched, func(m *consumer.Message) error {
			if m.ID == poison {
				return consumer.Permanent(errors.New("partner says no"))
			}
			return nil
		})
		poison = ids[3]
		events := &shareEventLog{}
		cfg.Hooks = append(cfg.Hooks, events)
		e.start(cfg)
		e.waitEffects(len(ids)-1, 30*time.Second)
		waitFor(t, 10*time.Second, "every letter reported removed", func() bool {
			return len(events.offsets(consumer.ShareProvisionalRemoved)) == len(ids)
		})
		written, removed := events.offsets(consumer.ShareProvisionalWritten), events.offsets(consumer.ShareProvisionalRemoved)
		require.Len(t, written, len(ids))
		for off := range written {
			require.Equal(t, 1, written[off], "offset %d written once", off)
			require.Equal(t, 1, removed[off], "offset %d removed once", off)
		}
		require.Zero(t, e.db.Int(t, `SELECT count(*) FROM `+e.db.Table("dead_letters")+` WHERE provisional`), "none left standing")
		require.Empty(t, events.offsets(consumer.ShareLockLost))
		require.Empty(t, events.offsets(consumer.ShareSettlementLost))
	})
}
