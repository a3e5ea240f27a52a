package consumer_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
)

// offTheNetwork routes cfg's member to the broker through a proxy of its
// own, which the test cuts or stalls: that member alone loses its way to
// the broker, while the group's other members reach it directly. The
// proxy rewrites the broker addresses the member learns, so that all of
// its connections go through it.
func (e *shareEnv) offTheNetwork(cfg *consumer.Config) *faultproxy.Kafka {
	e.t.Helper()
	p, err := faultproxy.StartKafka(e.kafka.Brokers[0])
	require.NoError(e.t, err)
	e.t.Cleanup(func() { p.Close() })
	cfg.Brokers = []string{p.Addr()}
	return p
}

// shareMemberView is what one member saw: its applied and skipped
// records, its handler calls and its share events.
type shareMemberView struct {
	rec    *recorder
	events *shareEventLog
	mu     sync.Mutex
	calls  map[string]int
}

func (v *shareMemberView) callsOf(id string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.calls[id]
}

// memberConfig is shareConfig with a view of the member's own.
func (e *shareEnv) memberConfig(batched bool, check func(*consumer.Message) error) (*consumer.Config, *shareMemberView) {
	v := &shareMemberView{rec: &recorder{}, events: &shareEventLog{}, calls: map[string]int{}}
	cfg := e.shareConfig(batched, func(m *consumer.Message) error {
		v.mu.Lock()
		v.calls[m.ID]++
		v.mu.Unlock()
		if check == nil {
			return nil
		}
		return check(m)
	})
	cfg.Hooks = append(cfg.Hooks, v.rec, v.events)
	return cfg, v
}

// blockOn returns a check that blocks the handler on message id, the
// first time it meets it, until release is closed; started is closed
// when it does.
func blockOn(id string, then func() error) (check func(*consumer.Message) error, started, release chan struct{}) {
	started, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	return func(m *consumer.Message) error {
		var err error
		if m.ID == id {
			once.Do(func() {
				close(started)
				<-release
				if then != nil {
					err = then()
				}
			})
		}
		return err
	}, started, release
}

func waitClosed(t *testing.T, c chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// A share member cut off from the broker while its handler holds a
// record: the lock runs out (the connection stalls, so neither the
// member's renewals nor a disconnect reach the broker) or the broker
// releases the member's records (the connection drops), and another
// member takes the record while the first's transaction is still open.
// The claim decides which of the two applies it: one effect. The first
// says what became of it and, back on the network, works again.
func TestShareGroupMemberOffTheNetwork(t *testing.T) {
	t.Run("a lock that runs out under a slow handler: the member that takes the record meets its claim", func(t *testing.T) {
		bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
			e := setupShare(t, shareOptions{})
			ids := e.produceIDs("m", 1)
			slow := ids[0]
			check, started, release := blockOn(slow, nil)
			cfgA, a := e.memberConfig(batched, check)
			proxy := e.offTheNetwork(cfgA)
			e.start(cfgA)
			waitClosed(t, started, "the slow record reaching the first member")
			proxy.Block()
			cfgB, b := e.memberConfig(batched, nil)
			stopB := e.start(cfgB)
			// B holds the record once the lock ran out under A, and its
			// claim waits for A's transaction.
			waitFor(t, 30*time.Second, "the second member's claim waiting for the first's transaction", func() bool {
				return e.db.LockWaits(t, "processed_messages") > 0
			})
			close(release)
			waitFor(t, 30*time.Second, "the second member meeting the first's claim", func() bool {
				return b.rec.snapshot().skipped[consumer.SkipAlreadyClaimed] > 0
			})
			e.requireExactlyOnce(ids)
			require.Equal(t, 1, e.callsOf(slow), "the handler ran once, on the first member")
			require.Zero(t, b.callsOf(slow), "the second member found the claim without its handler")
			require.Equal(t, 1, a.rec.snapshot().applied, "the first member applied it")

			// B's accept was taken: the record was B's. Back on the
			// network, A works again: the records that follow, B
			// stopped, are A's to apply.
			require.Empty(t, b.events.offsets(consumer.ShareSettlementLost), "the second member's accept taken")
			proxy.Restore()
			stopB.stop()
			more := e.produceIDs("after", 10)
			e.waitEffects(len(ids)+len(more), 30*time.Second)
			stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)+len(more)) })
			e.requireExactlyOnce(append(ids, more...))
			require.Equal(t, 1+len(more), a.rec.snapshot().applied, "the first member applied what followed")
		})
	})

	t.Run("a lock that runs out under a failing handler: the member gives the record up and the one that took it applies it", func(t *testing.T) {
		bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
			e := setupShare(t, shareOptions{})
			ids := e.produceIDs("m", 1)
			slow := ids[0]
			check, started, release := blockOn(slow, func() error { return errors.New("partner timed out") })
			cfgA, a := e.memberConfig(batched, check)
			cfgA.Retry.MaxAttempts = 1000
			proxy := e.offTheNetwork(cfgA)
			e.start(cfgA)
			waitClosed(t, started, "the slow record reaching the first member")
			proxy.Block()
			cfgB, b := e.memberConfig(batched, nil)
			e.start(cfgB)
			waitFor(t, 30*time.Second, "the second member's claim waiting for the first's transaction", func() bool {
				return e.db.LockWaits(t, "processed_messages") > 0
			})
			close(release)
			// A's transaction rolls back; before it tries again, A finds
			// the lock gone and stops working on the record.
			off := int64(0)
			waitFor(t, 30*time.Second, "the first member saying it lost the lock", func() bool {
				return a.events.offsets(consumer.ShareLockLost)[off] == 1
			})
			e.waitEffects(len(ids), 30*time.Second)
			e.requireExactlyOnce(ids)
			require.Equal(t, 1, b.callsOf(slow), "the second member applied it")
			proxy.Restore()
			stillFor(t, shareLock, "the first member not trying the record again", func() bool { return a.callsOf(slow) == 1 })
			require.Zero(t, a.rec.snapshot().applied)
			e.requireExactlyOnce(ids)
		})
	})

	t.Run("a connection that drops while the member holds records: every record applied once, and the member comes back", func(t *testing.T) {
		bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
			e := setupShare(t, shareOptions{})
			ids := e.produceIDs("m", 30)
			check, started, release := blockOn(ids[0], nil)
			cfgA, a := e.memberConfig(batched, check)
			cfgA.MaxBatch = 10
			proxy := e.offTheNetwork(cfgA)
			e.start(cfgA)
			waitClosed(t, started, "the first member holding records")
			proxy.Cut()
			cfgB, _ := e.memberConfig(batched, nil)
			cfgB.MaxBatch = 10
			stopB := e.start(cfgB)
			// B applies what A does not hold, and meets A's claims on
			// what A held (the broker gave them back when A's connection
			// dropped) once A's transaction is done.
			waitFor(t, 30*time.Second, "the second member waiting for the first's claims", func() bool {
				return e.db.LockWaits(t, "processed_messages") > 0
			})
			close(release)
			e.waitEffects(len(ids), 30*time.Second)
			proxy.Restore()
			stopB.stop()
			more := e.produceIDs("after", 10)
			e.waitEffects(len(ids)+len(more), 30*time.Second)
			stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)+len(more)) })
			e.requireExactlyOnce(append(ids, more...))
			require.GreaterOrEqual(t, a.rec.snapshot().applied, len(more), "the first member applied what followed")
		})
	})

	t.Run("a connection that stalls past the request timeout while the member settles: it polls again once back", func(t *testing.T) {
		if testing.Short() {
			t.Skip("waits out a request's 15 s bound twice; runs without -short")
		}
		bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
			e := setupShare(t, shareOptions{})
			ids := e.produceIDs("m", 5)
			var proxy *faultproxy.Kafka
			var once sync.Once
			// The connection stalls as the first transaction runs: its
			// accepts go unanswered, and the flush gives up.
			cfg, _ := e.memberConfig(batched, func(*consumer.Message) error {
				once.Do(func() { proxy.Block() })
				return nil
			})
			proxy = e.offTheNetwork(cfg)
			c, err := consumer.New(e.db.Pool, cfg)
			require.NoError(t, err)
			e.run(c)
			e.waitEffects(len(ids), 30*time.Second)
			waitFor(t, 60*time.Second, "the member's flush giving up, and its polls failing", func() bool {
				return strings.Contains(strings.Join(c.Health(context.Background()).Problems, "\n"), "its polls fail since")
			})
			proxy.Restore()
			more := e.produceIDs("after", 5)
			e.waitEffects(len(ids)+len(more), 30*time.Second)
			waitFor(t, 10*time.Second, "ready again", func() bool { return c.Health(context.Background()).Ready })
			stillFor(t, shareLock, "no effect applied twice", func() bool { return e.effects() == int64(len(ids)+len(more)) })
			e.requireExactlyOnce(append(ids, more...))
		})
	})
}

// A share group is handed committed records only: those of an aborted
// transaction are never applied, and those of a transaction left open are
// held back, with what follows them in the partition, until it commits.
// The consumer makes its group read committed as it joins (Kafka's, and
// kfake's, default is read_uncommitted).
func TestShareGroupAppliesCommittedRecordsOnly(t *testing.T) {
	bothWays(t, handlerKinds, func(t *testing.T, batched bool) {
		e := setupShare(t, shareOptions{})
		w, open := e.txnWriter("w"), e.txnWriter("open")
		ids := func(prefix string, from, n int) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = prefix + "-" + strconv.Itoa(from+i)
			}
			return out
		}
		before, aborted := ids("ok", 0, 3), ids("aborted", 0, 3)
		w.begin()
		w.write(before...)
		w.end(true)
		w.begin()
		w.write(aborted[:2]...)
		w.end(false)
		open.begin()
		open.write(ids("open", 0, 2)...)
		w.begin()
		w.write(ids("ok", 3, 2)...)
		w.end(true)
		w.begin()
		w.write(aborted[2:]...)
		w.end(false)
		open.write(ids("open", 2, 1)...)
		e.plain(ids("plain", 0, 2)...)

		for range 2 {
			e.start(e.shareConfig(batched, nil))
		}
		e.waitEffects(len(before), 30*time.Second)
		stillFor(t, 2*shareLock, "nothing past the open transaction applied, nothing aborted", func() bool { return e.effects() == int64(len(before)) })
		e.requireExactlyOnce(before)

		open.end(true)
		committed := slices.Concat(before, ids("open", 0, 2), ids("ok", 3, 2), ids("open", 2, 1), ids("plain", 0, 2))
		e.waitEffects(len(committed), 30*time.Second)
		stillFor(t, 2*shareLock, "no aborted record applied, no effect twice", func() bool { return e.effects() == int64(len(committed)) })
		e.requireExactlyOnce(committed)
		for _, id := range aborted {
			require.Zero(t, e.callsOf(id), "aborted record %s handed out", id)
		}
	})
}
