package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// TestShareGroupSoak is the soak's share group phase: random faults, from
// a seed, while four members of a share group take the records of two
// partitions, then the checker. Members stop and start (what they hold is
// released, a delivery spent), their Postgres sessions are terminated
// (pg_terminate_backend) and COMMIT replies lost, and the handler meets
// poison, transient failures and records that take twice the acquisition
// lock (renewed meanwhile). Every record must end applied once, or set
// aside: poison, or a record whose last delivery did not finish or failed.
// Odd seeds run a Handler, even seeds a BatchHandler. By default it runs
// seed 1 with 2,000 messages, kept short since it runs in CI; a longer run
// is
//
//	KAFKAONCE_SOAK_SEEDS="1 2 3 4" KAFKAONCE_SHARE_SOAK_MESSAGES=20000 go test ./consumer -run TestShareGroupSoak -timeout 30m -v
//
// A failing seed is printed; run it again with KAFKAONCE_SOAK_SEEDS=<seed>.
func TestShareGroupSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak is skipped in -short runs")
	}
	soakSeeds(t, "KAFKAONCE_SHARE_SOAK_MESSAGES", 2000, shareSoak)
}

// shareSoakFate is what a share soak message meets, from its id and the
// seed: poison (1 in 250), a transient failure on its first two calls (1
// in 50), a handler that takes twice the acquisition lock (1 in 400).
func shareSoakFate(seed uint64, id string) (poison, flaky, slow bool) {
	h := fnv.New64a()
	fmt.Fprintf(h, "share/%d/%s", seed, id)
	v := h.Sum64() % 1000
	return v%250 == 7, v%50 == 3, v%400 == 11
}

// shareSoakDeliveryLimit is the share soak group's delivery limit: low
// enough that a record some member stops on again and again reaches its
// last delivery now and then.
const shareSoakDeliveryLimit = 3

func shareSoak(t *testing.T, seed uint64, n int) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5a4e))
	const partitions, size = 2, 4
	e := setupShare(t, shareOptions{partitions: partitions, deliveryLimit: shareSoakDeliveryLimit})
	proxy, err := faultproxy.Start(e.db.ServerAddr(t))
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	// The members' sessions have an application name of their own, so
	// that the fault below terminates theirs and not the test's.
	app := e.db.Schema + "_members"
	pool := e.db.PoolVia(t, proxy.Addr(), testenv.MaxConns(20), func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })

	var attempts sync.Map
	var slowCalls atomic.Int64
	cfg := e.shareConfig(seed%2 == 0, func(m *consumer.Message) error {
		poison, flaky, slow := shareSoakFate(seed, m.ID)
		switch {
		case poison:
			return consumer.Permanent(errors.New("poison"))
		case flaky:
			c, _ := attempts.LoadOrStore(m.ID, new(atomic.Int32))
			if c.(*atomic.Int32).Add(1) <= 2 {
				return errors.New("transient")
			}
		case slow:
			slowCalls.Add(1)
			time.Sleep(2 * shareLock) // the lock is renewed meanwhile
		}
		return nil
	})
	events := &shareEventLog{}
	cfg.Hooks = append(cfg.Hooks, events)
	cfg.MaxBatch = 50
	cfg.Retry.MaxAttempts = 5
	cfg.Retry.InitialInterval = time.Millisecond
	cfg.Retry.MaxInterval = 20 * time.Millisecond
	cfg.LockTimeout = time.Second
	startMember := func() *running {
		c, err := consumer.New(pool, cfg)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		r := &running{t: t, cancel: cancel, done: make(chan error, 1)}
		go func() { r.done <- c.Run(ctx) }()
		return r
	}
	// A nil member is one stopped for a while.
	members := make([]*running, size)
	for i := range members {
		members[i] = startMember()
	}
	defer func() {
		for _, m := range members {
			if m != nil {
				m.stop()
			}
		}
	}()

	// The producer: n ids in waves of 100 over the partitions, 2% sent
	// twice (found claimed the second time), a wave a second.
	var ids, poison []string
	for i := range n {
		id := fmt.Sprintf("q%d-%06d", seed, i)
		ids = append(ids, id)
		if p, _, _ := shareSoakFate(seed, id); p {
			poison = append(poison, id)
		}
	}
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		w := e.kafka.Writer(e.topic)
		defer w.Close()
		prng := rand.New(rand.NewPCG(seed, 3))
		for i := 0; i < n; i += 100 {
			var msgs []kafka.Message
			for j := i; j < min(i+100, n); j++ {
				m := msg(j%partitions, ids[j], "v")
				msgs = append(msgs, m)
				if prng.IntN(50) == 0 {
					msgs = append(msgs, m)
				}
			}
			for {
				if err := w.WriteMessages(context.Background(), msgs...); err == nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(time.Second)
		}
	}()

	// settled counts the ids applied or set aside (a letter written
	// before a record's last delivery counts: if the delivery does not
	// finish, it stays).
	settled := func() int64 {
		return e.db.Int(t, `SELECT count(*) FROM (SELECT message_id FROM `+e.db.Table("effects")+` UNION SELECT message_id FROM `+
			e.db.Table("dead_letters")+` WHERE consumer = $1) s`, e.name)
	}
	// Faults, until the producer is done and 95% of the ids are settled
	// (at most five minutes). They pause while nothing progresses, so the
	// run tests that the members go on after faults, not how many faults
	// back to back a group survives.
	faults := map[string]int{}
	limit := time.Now().Add(5 * time.Minute)
	done := func() bool {
		select {
		case <-produced:
			return settled() >= int64(n)*95/100
		default:
			return false
		}
	}
	var last int64
	lastProgress := time.Now()
	for !done() && time.Now().Before(limit) {
		time.Sleep(time.Duration(200+rng.IntN(500)) * time.Millisecond)
		if s := settled(); s > last {
			last, lastProgress = s, time.Now()
		}
		if time.Since(lastProgress) > 3*time.Second {
			faults["paused: no progress"]++
			continue
		}
		switch rng.IntN(6) {
		case 0:
			i := rng.IntN(size)
			if members[i] != nil {
				members[i].stop()
			}
			members[i] = startMember()
			faults["member restarted"]++
		case 1:
			// Stopped for a while, or started again; never the last.
			i := rng.IntN(size)
			switch {
			case members[i] == nil:
				members[i] = startMember()
				faults["stopped member started"]++
			case live(members) > 1:
				members[i].stop()
				members[i] = nil
				faults["member stopped"]++
			}
		case 2, 3:
			killed := e.db.Int(t, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app)
			faults["postgres sessions terminated"] += int(killed)
		case 4:
			proxy.DropAfterCommits(1)
			faults["COMMIT reply lost"]++
		}
	}
	proxy.DropAfterCommits(0)
	for i := range members {
		if members[i] == nil {
			members[i] = startMember()
		}
	}
	waitFor(t, 3*time.Minute, "every record applied or set aside", func() bool { return settled() == int64(n) })
	// Producer re-sends, and records delivered again, may come after the
	// last effect: the members run until every share-partition drained.
	ends := map[int]int64{}
	for p := range partitions {
		ends[p] = e.logBounds(p)[1]
	}
	e.requireShareDrained(ends)
	stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == e.distinctEffects() })
	for i := range members {
		members[i].stop()
		members[i] = nil
	}
	waitFor(t, 10*time.Second, "no member session left in a transaction", func() bool {
		return e.db.Int(t, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, app) == 0
	})
	require.Zero(t, pool.Stat().AcquiredConns(), "connections of the members' pool still checked out")
	rec := e.events.snapshot()
	letters := e.countsBy(`SELECT error_class || CASE WHEN provisional THEN ' (provisional)' ELSE '' END, count(*) FROM `+e.db.Table("dead_letters")+` WHERE consumer = $1 GROUP BY 1`, e.name)
	t.Logf("seed %d: %d messages (%d poison) over %d partitions with %d members; %d found claimed, %d slow handler calls; share events: renewals refused %d, locks lost %d, settlements lost %d, provisional letters %d written, %d removed; letters %v; faults: %v",
		seed, n, len(poison), partitions, size, rec.skipped[consumer.SkipAlreadyClaimed], slowCalls.Load(),
		len(events.offsets(consumer.ShareRenewalRefused)), len(events.offsets(consumer.ShareLockLost)), len(events.offsets(consumer.ShareSettlementLost)),
		len(events.offsets(consumer.ShareProvisionalWritten)), len(events.offsets(consumer.ShareProvisionalRemoved)), letters, faults)
	require.Positive(t, slowCalls.Load(), "handlers ran past the lock")
	require.Positive(t, faults["postgres sessions terminated"], "sessions were terminated")
	e.check(expectation{ids: ids, poison: poison, shareLimit: shareSoakDeliveryLimit})
}

// live counts the members running.
func live(members []*running) int {
	n := 0
	for _, m := range members {
		if m != nil {
			n++
		}
	}
	return n
}
