package consumer_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/faultproxy"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
	"github.com/kafkaonce/kafkaonce/pauses"
)

// probe is one GET of h at path: its status and body.
func probe(t *testing.T, h http.Handler, method, path string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	var body map[string]any
	if rec.Code != http.StatusMethodNotAllowed {
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
	}
	return rec.Code, body
}

func TestHealth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ready while running in the group, and not before or after", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 2)
		e.produceIDs("h", 20)
		c, err := consumer.New(e.db.Pool, e.config(e.applyHandler()))
		require.NoError(t, err)
		h := c.Health(ctx)
		require.True(t, h.Live, h.Problems)
		require.False(t, h.Ready)
		require.Contains(t, strings.Join(h.Problems, "\n"), "not running")
		probes := consumer.HealthHandler(c)
		code, _ := probe(t, probes, http.MethodGet, "/health/livez")
		require.Equal(t, http.StatusOK, code)
		code, body := probe(t, probes, http.MethodGet, "/health/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code)
		require.Equal(t, false, body["ready"])
		code, _ = probe(t, probes, http.MethodPost, "/health/readyz")
		require.Equal(t, http.StatusMethodNotAllowed, code)

		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- c.Run(runCtx) }()
		waitFor(t, 30*time.Second, "ready", func() bool { return c.Health(ctx).Ready })
		h = c.Health(ctx)
		require.True(t, h.InGroup && h.Running && h.Live, h)
		require.Equal(t, 2, h.Partitions)
		code, body = probe(t, probes, http.MethodGet, "/health/readyz")
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, e.name, body["consumers"].([]any)[0].(map[string]any)["name"])
		cancel()
		require.NoError(t, <-done)
		h = c.Health(ctx)
		require.False(t, h.Ready || h.Running || h.InGroup, h)
	})

	t.Run("a probe whose client hung up leaves no answer of its own for the next", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		c, err := consumer.New(e.db.Pool, e.config(e.applyHandler()))
		require.NoError(t, err)
		gone, hangUp := context.WithCancel(ctx)
		hangUp()
		require.Empty(t, c.Health(gone).DatabaseError, "the database answered the question the probe asked")
		require.Empty(t, c.Health(ctx).DatabaseError, "the next probe, within the second the answer stands")
	})

	t.Run("fetches that hand out nothing while messages wait make the consumer not live, until they flow", func(t *testing.T) {
		t.Parallel()
		fake, err := devenv.StartFakeKafka()
		require.NoError(t, err)
		t.Cleanup(func() { fake.Close() })
		e := setupOn(t, 1, &testenv.Kafka{Kafka: fake})
		ids := e.produceIDs("s", 50)
		var starve atomic.Bool
		starve.Store(true)
		fake.Fake.ControlKey(int16(kmsg.Fetch), func(req kmsg.Request) (kmsg.Response, error, bool) {
			fake.Fake.KeepControl()
			if !starve.Load() {
				return nil, nil, false
			}
			time.Sleep(50 * time.Millisecond) // an empty answer, as a broker that has nothing would give
			return req.ResponseKind(), nil, true
		})
		cfg := e.config(e.applyHandler())
		cfg.StallAfter = time.Second
		c, err := consumer.New(e.db.Pool, cfg)
		require.NoError(t, err)
		defer e.run(c).stop()
		var h consumer.Health
		waitFor(t, 30*time.Second, "not live", func() bool { h = c.Health(ctx); return !h.Live })
		require.False(t, h.Ready)
		require.Contains(t, strings.Join(h.Problems, "\n"), "partition "+e.topic+"/0: no progress for")
		code, _ := probe(t, consumer.HealthHandler(c), http.MethodGet, "/livez")
		require.Equal(t, http.StatusServiceUnavailable, code)

		starve.Store(false)
		e.waitCommitted(map[int]int64{0: 50}, 60*time.Second)
		waitFor(t, 10*time.Second, "live again", func() bool { return c.Health(ctx).Live })
		e.check(expectation{ids: ids})
	})

	t.Run("a paused partition and one at the log's end are no stall", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 2)
		ids := e.produceIDs("i", 20)
		cfg := e.config(e.applyHandler())
		cfg.StallAfter = time.Second
		c, err := consumer.New(e.db.Pool, cfg)
		require.NoError(t, err)
		require.NoError(t, c.Pause(ctx, pauses.Partition(e.topic, 1), "held for the test"))
		defer e.run(c).stop()
		e.waitCommitted(map[int]int64{0: 10}, 30*time.Second)
		waitFor(t, 10*time.Second, "the pause counted", func() bool { return c.Health(ctx).Paused == 1 })
		stillFor(t, 2500*time.Millisecond, "a partition paused or at the log's end made the consumer not live", func() bool { return c.Health(ctx).Live })
		require.NoError(t, c.Resume(ctx, pauses.Partition(e.topic, 1)))
		e.waitCommitted(map[int]int64{0: 10, 1: 10}, 30*time.Second)
		e.check(expectation{ids: ids})
	})

	t.Run("Postgres gone makes a running consumer unready, and back ready again", func(t *testing.T) {
		t.Parallel()
		e := setup(t, 1)
		ids := e.produceIDs("g", 20)
		proxy, err := faultproxy.Start(e.db.ServerAddr(t))
		require.NoError(t, err)
		addr := proxy.Addr()
		c, err := consumer.New(e.db.PoolVia(t, addr), e.config(e.applyHandler()))
		require.NoError(t, err)
		defer e.run(c).stop()
		e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)
		waitFor(t, 30*time.Second, "ready", func() bool { return c.Health(ctx).Ready })

		require.NoError(t, proxy.Close()) // every connection cut, new ones refused
		var h consumer.Health
		waitFor(t, 30*time.Second, "unready without Postgres", func() bool { h = c.Health(ctx); return !h.Ready })
		require.NotEmpty(t, h.DatabaseError, h)
		require.True(t, h.InGroup, "the consumer stays in its group while Postgres is away")
		code, body := probe(t, consumer.HealthHandler(c), http.MethodGet, "/readyz")
		require.Equal(t, http.StatusServiceUnavailable, code, body)
		more := e.produceIDs("h", 10)

		waitFor(t, 10*time.Second, "the proxy listening again", func() bool {
			proxy, err = faultproxy.StartOn(addr, e.db.ServerAddr(t)) // Postgres is back
			return err == nil
		})
		t.Cleanup(func() { proxy.Close() })
		waitFor(t, 30*time.Second, "ready again", func() bool { return c.Health(ctx).Ready })
		code, body = probe(t, consumer.HealthHandler(c), http.MethodGet, "/readyz")
		require.Equal(t, http.StatusOK, code, body)
		e.waitCommitted(map[int]int64{0: 30}, 60*time.Second)
		e.check(expectation{ids: append(ids, more...)})
	})

	t.Run("a database that does not answer costs a probe a second, no more", func(t *testing.T) {
		t.Parallel()
		pool := hungDatabase(t)
		e := setup(t, 1)
		c, err := consumer.New(pool, e.config(e.applyHandler()))
		require.NoError(t, err)
		start := time.Now()
		h := c.Health(ctx)
		require.Less(t, time.Since(start), 3*time.Second, "the probe waited on the database past its bound")
		require.Contains(t, h.DatabaseError, "no answer within 1s")
		require.False(t, h.Ready)
		require.True(t, h.Live, "a database down is no reason to restart the consumer")
	})
}

// A member that cannot get into its group for StallAfter is not live: its
// group loop is as wedged as a partition that cannot fetch.
func TestHealthNotLiveOutOfTheGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := setup(t, 1)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there: no broker answers
	cfg := e.config(e.applyHandler())
	cfg.Brokers = []string{addr}
	cfg.StallAfter = time.Second
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	defer e.run(c).stop()
	var h consumer.Health
	waitFor(t, 30*time.Second, "not live out of the group", func() bool { h = c.Health(ctx); return !h.Live })
	require.False(t, h.InGroup)
	require.Contains(t, strings.Join(h.Problems, "\n"), "not in consumer group "+e.group+" for ")
}

// A member the group assigns nothing (more members than partitions) is in
// its group, live and ready: it must not be restarted for having no work.
func TestHealthOfAMemberWithNothingToDo(t *testing.T) {
	t.Parallel()
	eachProtocol(t, func(t *testing.T, proto consumer.GroupProtocol) {
		memberWithNothingToDo(t, setupProtocol(t, 1, proto))
	})
}

func memberWithNothingToDo(t *testing.T, e *env) {
	ctx := context.Background()
	e.produceIDs("n", 10)
	var members []*consumer.Consumer
	for range 2 {
		cfg := e.config(e.applyHandler())
		cfg.StallAfter = time.Second
		c, err := consumer.New(e.db.Pool, cfg)
		require.NoError(t, err)
		defer e.run(c).stop()
		members = append(members, c)
	}
	e.waitCommitted(map[int]int64{0: 10}, 60*time.Second)
	waitFor(t, 30*time.Second, "one member with the partition, one with none", func() bool {
		a, b := members[0].Health(ctx), members[1].Health(ctx)
		return a.Partitions+b.Partitions == 1 && a.InGroup && b.InGroup
	})
	stillFor(t, 2500*time.Millisecond, "a member with nothing to do was not live or not ready", func() bool {
		for _, c := range members {
			if h := c.Health(ctx); !h.Live || !h.Ready {
				t.Logf("%+v", h)
				return false
			}
		}
		return true
	})
	// Each reports itself as the group coordinator describes it: its
	// protocol, its member id, and its generation or epoch.
	waitFor(t, 30*time.Second, "each member's Health naming it as the broker does", func() bool {
		broker := describedMembers(t, e)
		for _, c := range members {
			g := c.Health(ctx).Group
			require.NotNil(t, g)
			require.Equal(t, e.protocol.String(), g.Protocol)
			if gen, ok := broker[g.MemberID]; !ok || gen != -1 && gen != g.Generation || g.Generation <= 0 {
				t.Logf("member %s in generation %d; the broker describes %v", g.MemberID, g.Generation, broker)
				return false
			}
		}
		return true
	})
}

// describedMembers is the group's members as the group coordinator
// describes them, each with its epoch under the consumer protocol (-1
// under the classic one, whose describe tells no generation).
func describedMembers(t *testing.T, e *env) map[string]int32 {
	adm := kadm.NewClient(e.kafka.Client(t))
	ctx := testenv.Context(t, 10*time.Second)
	out := map[string]int32{}
	if e.protocol == consumer.ConsumerProtocol {
		d, err := adm.DescribeConsumerGroups(ctx, e.group)
		require.NoError(t, err)
		for _, m := range d[e.group].Members {
			out[m.MemberID] = m.MemberEpoch
		}
		return out
	}
	d, err := adm.DescribeGroups(ctx, e.group)
	require.NoError(t, err)
	g := d[e.group]
	// DescribeGroups tells no generation: -1 for each member.
	for _, m := range g.Members {
		out[m.MemberID] = -1
	}
	return out
}
