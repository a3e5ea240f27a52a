package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// shareBatches records a share member's batch hooks.
type shareBatches struct {
	mu             sync.Mutex
	started, ended int
	applied        int
	infos          []consumer.BatchInfo
}

func (b *shareBatches) OnBatchStart(_ context.Context, info consumer.BatchInfo) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.started++
	b.infos = append(b.infos, info)
}

func (b *shareBatches) OnBatchEnd(_ context.Context, _ consumer.BatchInfo, r consumer.BatchResult) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.ended++
	b.applied += r.Applied
}

func (b *shareBatches) counts() (started, ended, applied int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.started, b.ended, b.applied
}

// A share member's transactions are batches to the hooks, as a consumer
// group's are: each bounded by HookBatchStart and HookBatchEnd, whose
// results count every record applied, so that the batch metrics
// (transaction durations, batch sizes) and tracing's batch spans cover
// share groups too.
func TestShareGroupTransactionsCallTheBatchHooks(t *testing.T) {
	bothWays(t, [2]string{"Handler", "BatchHandler"}, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{})
		ids := e.produceIDs("m", 40)
		b := &shareBatches{}
		cfg := e.shareConfig(batched, nil)
		cfg.MaxBatch = 10
		cfg.Hooks = append(cfg.Hooks, b)
		e.start(cfg)
		e.waitEffects(len(ids), 30*time.Second)
		waitFor(t, 10*time.Second, "every record applied counted by the batch ends", func() bool {
			_, _, applied := b.counts()
			return applied == len(ids)
		})
		started, ended, _ := b.counts()
		require.Equal(t, started, ended, "each batch started ends")
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, info := range b.infos {
			require.Equal(t, e.topic, info.Topic)
			require.LessOrEqual(t, info.Size, 10)
			require.Equal(t, info.Size, int(info.LastOffset-info.FirstOffset)+1, "one poll's records of one partition, in offset order")
			require.EqualValues(t, -1, info.HighWaterMark, "a share member reads no log end")
			require.Equal(t, 1, info.Attempt)
		}
	})
}
