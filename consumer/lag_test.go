package consumer_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// lagWatch keeps the last lag reported for each partition.
type lagWatch struct {
	mu   sync.Mutex
	last map[int]consumer.PartitionLag
}

func (l *lagWatch) OnPartitionLag(_ context.Context, lag consumer.PartitionLag) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[int]consumer.PartitionLag{}
	}
	l.last[lag.Partition] = lag
}

func (l *lagWatch) of(partition int) (consumer.PartitionLag, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lag, ok := l.last[partition]
	return lag, ok
}

// Lag counts what the consumer has yet to apply: on an idle partition at
// the end of its log it is 0, also where the log ends in a transaction's
// commit marker, or in the records and marker of an aborted transaction,
// which the high watermark counts and no handler ever sees. (A lag stuck
// above 0 pages for a stuck partition: docs/metrics.md.)
func TestLagReturnsToZeroAtTheEndOfTheLog(t *testing.T) {
	t.Parallel()
	if kafkaClient() == consumer.KafkaGo {
		t.Skip("kafka-go cannot read transactional topics (ErrTransactionalTopic)")
	}
	for _, tail := range []struct {
		name  string
		write func(e *env) []string // returns the ids that are applied
	}{
		{"plain messages", func(e *env) []string { return e.ids(idRules[0], e.plain("p-0", "p-1", "p-2")) }},
		{"a committed transaction: the log ends in its marker", func(e *env) []string {
			w := e.txnWriter("committed")
			w.begin()
			recs := w.write("c-0", "c-1", "c-2")
			w.endSettled(true)
			return e.ids(idRules[0], recs)
		}},
		{"an aborted transaction: the log ends in its records and marker", func(e *env) []string {
			applied := e.ids(idRules[0], e.plain("p-0", "p-1"))
			w := e.txnWriter("aborted")
			w.begin()
			w.write("a-0", "a-1", "a-2", "a-3", "a-4")
			w.endSettled(false)
			return applied
		}},
	} {
		t.Run(tail.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			watch := &lagWatch{}
			cfg := e.txnConfig(idRules[0], false)
			cfg.Hooks = append(cfg.Hooks, watch)
			r := e.start(cfg)
			ids := tail.write(e)
			end := e.logBounds(0)[1]
			e.waitEffects(len(ids), 30*time.Second)
			waitFor(t, 30*time.Second, "the lag reported at the log's end", func() bool {
				lag, ok := watch.of(0)
				return ok && lag.LogEnd == end && lag.Position == end
			})
			lag, _ := watch.of(0)
			require.Zero(t, lag.Lag, "lag at the end of the log: %+v", lag)
			r.stop()
			e.requireExactlyOnce(ids)
		})
	}
}
