package consumer_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
)

// crashPointMessages is how many messages each run of the campaign
// processes: two batches' worth, so that a run crosses a first batch
// (claims, the first position) and a later one (one round trip).
const crashPointMessages = 6

// The connection to Postgres cut at every boundary a consumer crosses,
// one boundary per run: each round trip it sends, from its first
// statement at start-up through two batches and its shutdown, cut once
// before the server saw any of it and once after the server had it all
// (for the COMMIT's round trip: a crash before the COMMIT, and one after
// it whose reply never came). The boundaries are counted, not named, so
// a statement added later is a boundary too. Whatever run the cut falls
// in, the consumer (started again if its Run failed) applies every
// message once, never commits an offset ahead of its stored position,
// and sets nothing aside. Each way of handling a batch crosses boundaries
// of its own.
func TestAConnectionCutAtEveryRoundTripAppliesEachMessageOnce(t *testing.T) {
	t.Parallel()
	for _, path := range []struct {
		name string
		cfg  func(e *env) *consumer.Config
	}{
		{"Handler", func(e *env) *consumer.Config { return e.config(e.applyHandler()) }},
		{"BatchHandler, one round trip", func(e *env) *consumer.Config { return batchConfig(e, queueingBatchHandler(e)) }},
		{"BatchHandler, ClaimFirst", func(e *env) *consumer.Config {
			cfg := batchConfig(e, queueingBatchHandler(e))
			cfg.ClaimFirst = true
			return cfg
		}},
	} {
		t.Run(path.name, func(t *testing.T) {
			t.Parallel()
			cutAtEveryRoundTrip(t, path.cfg)
		})
	}
}

// queueingBatchHandler queues each message's effect.
func queueingBatchHandler(e *env) consumer.BatchHandler {
	insert := `INSERT INTO ` + e.db.Table("effects") + ` (message_id, topic, partition, kafka_offset, value) VALUES ($1, $2, $3, $4, $5)`
	return consumer.BatchHandlerFunc(func(ctx context.Context, b *consumer.Batch) error {
		for _, m := range b.Messages {
			b.Queue(insert, m.ID, m.Topic, m.Partition, m.Offset, string(m.Value))
		}
		return nil
	})
}

func cutAtEveryRoundTrip(t *testing.T, config func(e *env) *consumer.Config) {
	boundaries := countRoundTrips(t, config)
	// Other connections' round trips (maintenance, a second worker's
	// connection) interleave differently from run to run, so a number
	// names a slightly different boundary each time, and a late one may
	// fall past the end of its run; nearly every run must be cut.
	var cut atomic.Int64
	t.Cleanup(func() {
		t.Logf("%d round trips to cut at; %d of %d runs cut", boundaries, cut.Load(), 2*boundaries)
		require.GreaterOrEqual(t, cut.Load(), 2*boundaries*9/10, "runs whose connection was cut")
	})
	for n := int64(1); n <= boundaries; n++ {
		for _, after := range []bool{false, true} {
			name := strconv.FormatInt(n, 10) + "/before"
			if after {
				name = strconv.FormatInt(n, 10) + "/after"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := setup(t, 1)
				proxy, err := faultproxy.Start(e.db.ServerAddr(t))
				require.NoError(t, err)
				t.Cleanup(func() { proxy.Close() })
				proxy.CutAtRoundTrip(n, after)
				proxy.CountRoundTrips()
				ids := crashPointRun(e, proxy, config(e))
				cut.Add(proxy.RoundTripsCut())
				e.check(expectation{ids: ids})
				require.Empty(t, e.letters(), "a cut connection set a message aside")
			})
		}
	}
}

// countRoundTrips runs the campaign's run once without a cut and returns
// the round trips it sent.
func countRoundTrips(t *testing.T, config func(e *env) *consumer.Config) int64 {
	e := setup(t, 1)
	proxy, err := faultproxy.Start(e.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	proxy.CountRoundTrips()
	ids := crashPointRun(e, proxy, config(e))
	e.check(expectation{ids: ids})
	require.Positive(t, proxy.RoundTrips())
	return proxy.RoundTrips()
}

// crashPointRun produces the campaign's messages, half before the
// consumer starts and half once the first half is committed, and runs a
// consumer through proxy until every one is committed; a Run that fails
// (a cut during its start-up checks) is started again, as a supervisor
// would restart the process.
func crashPointRun(e *env, proxy *faultproxy.Proxy, cfg *consumer.Config) []string {
	t := e.t
	ids := e.produceIDs("a", crashPointMessages/2)
	cfg.MaxBatch = crashPointMessages / 2
	pool := e.db.PoolVia(t, proxy.Addr())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	start := func() {
		c, err := consumer.New(pool, cfg)
		require.NoError(t, err)
		go func() { done <- c.Run(ctx) }()
	}
	start()
	committed := func(end int64) {
		deadline := time.Now().Add(60 * time.Second)
		for e.kafka.CommittedOffsets(t, e.group, e.topic, 1)[0] < end {
			select {
			case err := <-done:
				t.Logf("Run returned %v; starting it again", err)
				start()
			case <-time.After(20 * time.Millisecond):
			}
			require.False(t, time.Now().After(deadline), "offset %d committed within 60s", end)
		}
	}
	committed(crashPointMessages / 2)
	ids = append(ids, e.produceIDs("b", crashPointMessages/2)...)
	committed(crashPointMessages)
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30s of cancel")
	}
	return ids
}
