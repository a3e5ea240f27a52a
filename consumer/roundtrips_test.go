package consumer_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// roundTrips counts round trips to Postgres on the wire, connection by
// connection: a burst of writes followed by a read is one, however many
// statements it carries.
type roundTrips struct {
	mu    sync.Mutex
	conns []*countingConn
}

func (r *roundTrips) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	cc := &countingConn{Conn: c}
	r.mu.Lock()
	r.conns = append(r.conns, cc)
	r.mu.Unlock()
	return cc, nil
}

// counts are each connection's round trips so far.
func (r *roundTrips) counts() map[*countingConn]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[*countingConn]int64, len(r.conns))
	for _, c := range r.conns {
		out[c] = c.n.Load()
	}
	return out
}

type countingConn struct {
	net.Conn
	n       atomic.Int64
	writing atomic.Bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	if !c.writing.Swap(true) {
		c.n.Add(1)
	}
	return c.Conn.Write(p)
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.writing.Store(false)
	return c.Conn.Read(p)
}

// perBatch records the round trips of each batch, between its start and
// its end: those of the connection that made the most, which is the
// batch's (its transaction holds one connection throughout). The
// consumer's background reads of the same pool (its pauses each second,
// its redrives every two) go through other connections, so one that
// lands during a batch is not counted as the batch's.
type perBatch struct {
	rt     *roundTrips
	mu     sync.Mutex
	start  map[*countingConn]int64
	counts []int64
}

func (p *perBatch) OnBatchStart(context.Context, consumer.BatchInfo) { p.start = p.rt.counts() }

func (p *perBatch) OnBatchEnd(_ context.Context, _ consumer.BatchInfo, r consumer.BatchResult) {
	if r.Err != nil {
		return
	}
	var most int64
	for c, n := range p.rt.counts() {
		most = max(most, n-p.start[c])
	}
	p.mu.Lock()
	p.counts = append(p.counts, most)
	p.mu.Unlock()
}

func (p *perBatch) median() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := slices.Clone(p.counts)
	slices.Sort(s)
	return s[len(s)/2]
}

// A batch of new messages whose BatchHandler only queues costs one round
// trip: BEGIN, position check, claims, effects, position, COMMIT. Claiming
// first (ClaimFirst, a handler that uses Tx, a Handler) costs two: BEGIN,
// position and claims in one; queued effects, position and COMMIT in the
// other. A Handler's own statements add theirs (here one INSERT per
// message, 50 per batch).
func TestRoundTripsPerBatch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		batch      bool
		claimFirst bool
		usesTx     bool
		want       int64
	}{
		{"handler", false, false, false, 2 + 50},
		{"batch handler with a queued statement", true, false, false, 1},
		{"batch handler with a queued statement, claim first", true, true, false, 2},
		{"batch handler reading through Tx", true, false, true, 2 + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t, 1)
			rt := &roundTrips{}
			pool := e.db.PoolVia(t, e.db.ServerAddr(t), func(cfg *pgxpool.Config) { cfg.ConnConfig.DialFunc = rt.dial })
			ids := e.produceIDs("rt", 1000)
			var cfg *consumer.Config
			if c.batch {
				h := &batchEffects{e: e}
				if c.usesTx {
					h.read = true
				}
				cfg = batchConfig(e, h)
				cfg.ClaimFirst = c.claimFirst
			} else {
				cfg = e.config(e.applyHandler())
			}
			cfg.MaxBatch = 50
			counts := &perBatch{rt: rt}
			cfg.Hooks = append(cfg.Hooks, counts)
			r := e.start(cfg, pool)
			e.waitCommitted(map[int]int64{0: 1000}, 30*time.Second)
			r.stop()
			require.Equal(t, c.want, counts.median(), "round trips per batch: %v", counts.counts)
			e.requireExactlyOnce(ids)
			e.check(expectation{ids: ids})
		})
	}
}
