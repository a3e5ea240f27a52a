package consumer_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// groupProtocols are the protocols the group tests run under.
var groupProtocols = []consumer.GroupProtocol{consumer.ClassicProtocol, consumer.ConsumerProtocol}

// setupProtocol is setup for a group whose members speak proto. Under the
// consumer protocol the broker is testenv.ConsumerProtocolKafkaSession's,
// which skips the test unless it serves the protocol, and the group has
// the tests' session (or o's) and heartbeat. The kafka-go client speaks
// only the classic protocol: the consumer protocol's tests are skipped
// with it.
func setupProtocol(t *testing.T, partitions int, proto consumer.GroupProtocol, opts ...protocolOptions) *env {
	t.Helper()
	if proto == consumer.ClassicProtocol {
		return setup(t, partitions)
	}
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("kafka-go speaks only the classic group protocol")
	}
	sessionMs := testenv.ConsumerProtocolSessionMs
	if len(opts) > 0 && opts[0].session > 0 {
		sessionMs = strconv.Itoa(int(opts[0].session.Milliseconds()))
	}
	k := testenv.ConsumerProtocolKafkaSession(t, sessionMs)
	e := setupOn(t, partitions, k)
	e.protocol = proto
	k.ConsumerProtocolGroup(t, e.group)
	return e
}

// protocolOptions change a consumer-protocol group's configs.
type protocolOptions struct {
	// session is the group's consumer.session.timeout.ms (0:
	// testenv.ConsumerProtocolSessionMs). Classic members set their own.
	session time.Duration
}

// eachProtocol runs test once per group protocol, as subtests.
func eachProtocol(t *testing.T, test func(t *testing.T, proto consumer.GroupProtocol)) {
	for _, proto := range groupProtocols {
		t.Run(proto.String()+" protocol", func(t *testing.T) {
			t.Parallel()
			test(t, proto)
		})
	}
}

// New refuses a group protocol the client or the kind of group cannot
// speak, and the member settings the consumer protocol leaves to the
// group, each error naming the field and the fix.
func TestGroupProtocolConfig(t *testing.T) {
	t.Parallel()
	consumerProtocol := func(mutate func(*consumer.Config)) *consumer.Config {
		c := validConfig()
		c.GroupProtocol = consumer.ConsumerProtocol
		mutate(c)
		return c
	}
	t.Run("accepted", func(t *testing.T) {
		t.Parallel()
		for _, c := range []*consumer.Config{
			consumerProtocol(func(*consumer.Config) {}),
			consumerProtocol(func(c *consumer.Config) { c.InstanceID = "pod-0"; c.RebalanceTimeout = time.Minute }),
		} {
			_, err := consumer.New(unusedPool(t), c)
			require.NoError(t, err)
		}
	})
	cases := []struct {
		name   string
		mutate func(*consumer.Config)
		want   []string
	}{
		{"kafka-go", func(c *consumer.Config) { c.KafkaClient = consumer.KafkaGo }, []string{"GroupProtocol ConsumerProtocol needs KafkaClient: consumer.FranzGo", "kafka-go speaks only the classic protocol"}},
		{"share group", func(c *consumer.Config) { c.GroupType = consumer.ShareGroup }, []string{"GroupProtocol ConsumerProtocol is for consumer groups", "leave GroupProtocol unset"}},
		{"session timeout", func(c *consumer.Config) { c.SessionTimeout = 20 * time.Second }, []string{"SessionTimeout is the group's setting under GroupProtocol ConsumerProtocol", "consumer.session.timeout.ms=20000"}},
		{"heartbeat interval", func(c *consumer.Config) { c.HeartbeatInterval = time.Second }, []string{"HeartbeatInterval is the group's setting", "consumer.heartbeat.interval.ms=1000"}},
		{"unknown protocol", func(c *consumer.Config) { c.GroupProtocol = 7 }, []string{"GroupProtocol must be consumer.ClassicProtocol or consumer.ConsumerProtocol (got 7)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := consumer.New(unusedPool(t), consumerProtocol(tc.mutate))
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
			require.True(t, strings.HasPrefix(err.Error(), "consumer: "), err.Error())
		})
	}
}

// A member that asked for the consumer protocol and cannot have it fails,
// and says which broker it needs, rather than join as a classic member:
// kgo would fall back without a word both when the broker does not
// advertise ConsumerGroupHeartbeat v1 and when it answers it
// UNSUPPORTED_VERSION. On a real broker without the protocol (Kafka 3.9.1
// in CI) the member is refused by the broker's own answer. A coordinator
// whose describe does not answer the question yet is asked again: a
// member is refused on an answer, never on a hiccup.
func TestConsumerProtocolIsNeverAFallBack(t *testing.T) {
	t.Parallel()
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("kafka-go speaks only the classic group protocol")
	}
	runOn := func(t *testing.T, k *testenv.Kafka) (error, *env) {
		e := setupOn(t, 1, k)
		e.protocol = consumer.ConsumerProtocol
		e.produceIDs("m", 5)
		c, err := consumer.New(e.db.Pool, e.config(e.applyHandler()))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return c.Run(ctx), e
	}
	if os.Getenv("KAFKA_BROKERS") != "" {
		k := testenv.NewKafka(t)
		if testenv.ConsumerProtocolServed(t, k.Brokers) {
			t.Skip("the broker serves the consumer protocol; the refusals are tested on kfake, which serves it only in part")
		}
		err, e := runOn(t, k)
		require.ErrorIs(t, err, consumer.ErrConsumerProtocolUnavailable)
		require.Contains(t, err.Error(), "GroupProtocol ConsumerProtocol needs Kafka 4.0 or later")
		require.Zero(t, e.effects(), "nothing is applied by a member that cannot have its protocol")
		return
	}
	run := func(t *testing.T, opts []kfake.Opt, after func(*kfake.Cluster)) (error, *env) {
		k, err := devenv.StartFakeKafka(opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = k.Close() })
		if after != nil {
			after(k.Fake)
		}
		return runOn(t, &testenv.Kafka{Kafka: k})
	}
	t.Run("a broker that does not advertise it", func(t *testing.T) {
		t.Parallel()
		err, e := run(t, []kfake.Opt{kfake.MaxVersions(kversion.V3_9_0())}, nil)
		require.Error(t, err)
		require.ErrorIs(t, err, consumer.ErrConsumerProtocolUnavailable)
		require.Contains(t, err.Error(), "GroupProtocol ConsumerProtocol needs Kafka 4.0 or later")
		require.Contains(t, err.Error(), "ConsumerGroupHeartbeat")
		require.Zero(t, e.effects(), "nothing is applied by a member that cannot have its protocol")
	})
	t.Run("a coordinator that does not list the member at first", func(t *testing.T) {
		t.Parallel()
		// A describe that does not answer the question is asked again:
		// the member joins once the coordinator lists it.
		var unlisted atomic.Int32
		k, err := devenv.StartFakeKafka()
		require.NoError(t, err)
		t.Cleanup(func() { _ = k.Close() })
		c := k.Fake
		c.ControlKey(int16(kmsg.ConsumerGroupDescribe), func(req kmsg.Request) (kmsg.Response, error, bool) {
			if unlisted.Load() >= 3 {
				return nil, nil, false
			}
			c.KeepControl()
			unlisted.Add(1)
			resp := req.(*kmsg.ConsumerGroupDescribeRequest).ResponseKind().(*kmsg.ConsumerGroupDescribeResponse)
			for _, g := range req.(*kmsg.ConsumerGroupDescribeRequest).Groups {
				rg := kmsg.NewConsumerGroupDescribeResponseGroup()
				rg.Group, rg.State = g, "Reconciling"
				resp.Groups = append(resp.Groups, rg)
			}
			return resp, nil, true
		})
		e := setupOn(t, 1, &testenv.Kafka{Kafka: k})
		e.protocol = consumer.ConsumerProtocol
		ids := e.produceIDs("m", 5)
		r := e.start(e.config(e.applyHandler()))
		e.waitEffects(len(ids), 60*time.Second)
		r.stop()
		require.EqualValues(t, 3, unlisted.Load(), "the coordinator was asked again after describing the group without the member")
		e.requireExactlyOnce(ids)
	})
	t.Run("a broker that advertises it and refuses it", func(t *testing.T) {
		t.Parallel()
		err, e := run(t, nil, func(c *kfake.Cluster) {
			c.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				resp := req.(*kmsg.ConsumerGroupHeartbeatRequest).ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
				resp.ErrorCode = 35 // UNSUPPORTED_VERSION
				return resp, nil, true
			})
		})
		require.Error(t, err)
		require.ErrorIs(t, err, consumer.ErrConsumerProtocolUnavailable)
		require.Contains(t, err.Error(), "does not describe group")
		require.Zero(t, e.effects(), "nothing is applied by a member that fell back to the classic protocol")
	})
}

// A consumer-protocol member the broker fences (FENCED_MEMBER_EPOCH on a
// heartbeat) while a transaction of its is open loses its partitions, as
// a classic member that loses its generation does: the transaction may
// still commit, but its offsets are never committed after the fence, the
// member rejoins at epoch 0 under the same id, and the partition starts
// again from the stored position. Nothing is applied twice, none skipped.
func TestConsumerProtocolMemberFencedMidTransaction(t *testing.T) {
	t.Parallel()
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("on kfake only: the fence is injected on the broker's heartbeat answer (a real broker's fencing is TestZombieMemberCannotCommitOffsets)")
	}
	e := setupProtocol(t, 1, consumer.ConsumerProtocol)
	ids := e.produceIDs("f", 40)
	blocked, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	apply := e.applyHandler()
	cfg := e.config(consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "f-20" {
			once.Do(func() { close(blocked) })
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return apply.Handle(ctx, tx, m)
	}))
	cfg.MaxBatch = 10
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	r := e.run(c)
	<-blocked
	before := c.Health(context.Background()).Group
	require.Positive(t, before.Generation)

	fake := e.kafka.Fake
	var fenced sync.Once
	fake.ControlKey(kmsg.ConsumerGroupHeartbeat.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		req := kreq.(*kmsg.ConsumerGroupHeartbeatRequest)
		if req.MemberEpoch <= 0 {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		resp.ErrorCode = kerr.FencedMemberEpoch.Code
		// The transaction in flight goes on to commit after the fence.
		fenced.Do(func() { close(release) })
		return resp, nil, true
	})

	e.waitEffects(len(ids), 60*time.Second)
	e.waitCommitted(map[int]int64{0: int64(len(ids))}, 60*time.Second)
	var after *consumer.GroupHealth
	waitFor(t, 30*time.Second, "the member back in its group", func() bool {
		h := c.Health(context.Background())
		after = h.Group
		return h.InGroup && after.Generation > 0
	})
	require.Equal(t, before.MemberID, after.MemberID, "a fenced member rejoins under its id")
	assigned, _ := e.events.assignments()
	require.GreaterOrEqual(t, assigned, 2, "the fence cost the member its partition, assigned again once it rejoined")
	r.stop()
	e.requireExactlyOnce(ids)
	e.check(expectation{ids: ids})
}
