package consumer_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// groupProtocols are the protocols the group tests run under.
var groupProtocols = []consumer.GroupProtocol{consumer.ClassicProtocol, consumer.ConsumerProtocol}

// Under the consumer protocol a group's session and heartbeat are the
// broker's to set: the tests give their groups the session their classic
// members ask for (env.config), and a short heartbeat, so that partitions
// move within a second or two.
const (
	protocolSessionMs   = "6000"
	protocolHeartbeatMs = "250"
)

// setupProtocol is setup for a group whose members speak proto. Under the
// consumer protocol, with KAFKA_BROKERS set, the test is skipped unless
// the broker serves the protocol, and the session and heartbeat are the
// group's configs; else the broker is a kfake of the test's own with them
// as its broker configs (kfake takes a group's heartbeat from those
// alone). The kafka-go client speaks only the classic protocol: the
// consumer protocol's tests are skipped with it.
func setupProtocol(t *testing.T, partitions int, proto consumer.GroupProtocol) *env {
	t.Helper()
	if proto == consumer.ClassicProtocol {
		e := setup(t, partitions)
		return e
	}
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("kafka-go speaks only the classic group protocol")
	}
	if os.Getenv("KAFKA_BROKERS") != "" {
		k := testenv.NewKafka(t)
		testenv.RequireConsumerProtocol(t, k.Brokers)
		e := setupOn(t, partitions, k)
		e.protocol = proto
		require.NoError(t, franz.SetGroupConfigs(testenv.Context(t, 10*time.Second), k.Client(t), e.group, map[string]string{
			"consumer.session.timeout.ms":    protocolSessionMs,
			"consumer.heartbeat.interval.ms": protocolHeartbeatMs,
		}))
		return e
	}
	k, err := devenv.StartFakeKafka(kfake.BrokerConfigs(map[string]string{
		"group.consumer.session.timeout.ms":    protocolSessionMs,
		"group.consumer.heartbeat.interval.ms": protocolHeartbeatMs,
	}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = k.Close() })
	e := setupOn(t, partitions, &testenv.Kafka{Kafka: k})
	e.protocol = proto
	return e
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
// UNSUPPORTED_VERSION.
func TestConsumerProtocolIsNeverAFallBack(t *testing.T) {
	t.Parallel()
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("on kfake only: a broker of the test's own, which serves the protocol only in part")
	}
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("kafka-go speaks only the classic group protocol")
	}
	run := func(t *testing.T, opts []kfake.Opt, after func(*kfake.Cluster)) (error, *env) {
		k, err := devenv.StartFakeKafka(opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = k.Close() })
		if after != nil {
			after(k.Fake)
		}
		e := setupOn(t, 1, &testenv.Kafka{Kafka: k})
		e.protocol = consumer.ConsumerProtocol
		e.produceIDs("m", 5)
		c, err := consumer.New(e.db.Pool, e.config(e.applyHandler()))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		return c.Run(ctx), e
	}
	t.Run("a broker that does not advertise it", func(t *testing.T) {
		t.Parallel()
		err, e := run(t, []kfake.Opt{kfake.MaxVersions(kversion.V3_9_0())}, nil)
		require.Error(t, err)
		require.Contains(t, err.Error(), "GroupProtocol ConsumerProtocol needs Kafka 4.0 or later")
		require.Contains(t, err.Error(), "ConsumerGroupHeartbeat")
		require.Zero(t, e.effects(), "nothing is applied by a member that cannot have its protocol")
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
		require.Contains(t, err.Error(), "does not describe group")
		require.Zero(t, e.effects(), "nothing is applied by a member that fell back to the classic protocol")
	})
}

// partitionHolder is a hook that keeps, per member, the partitions it
// holds and how often each was assigned and revoked: a worker's hooks'
// context ends when it returns, so an assignment's context ending is its
// revocation.
type partitionHolder struct {
	mu       sync.Mutex
	held     map[int]bool
	assigned int
	revoked  int
}

func newPartitionHolder() *partitionHolder { return &partitionHolder{held: map[int]bool{}} }

func (h *partitionHolder) OnPartitionAssigned(ctx context.Context, a consumer.PartitionAssignment) {
	h.mu.Lock()
	h.held[a.Partition] = true
	h.assigned++
	h.mu.Unlock()
	go func() {
		<-ctx.Done()
		h.mu.Lock()
		delete(h.held, a.Partition)
		h.revoked++
		h.mu.Unlock()
	}()
}

// state returns the partitions held, sorted, and the counts so far.
func (h *partitionHolder) state() (held []int, assigned, revoked int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := range h.held {
		held = append(held, p)
	}
	slices.Sort(held)
	return held, h.assigned, h.revoked
}

// A member joining or leaving moves only the partitions that change owner:
// under either protocol a member that keeps a partition is never made to
// give it up and take it back. Three members share twelve partitions under
// steady load, a fourth joins, leaves, and one of the three leaves; after
// each change every member still running was revoked exactly the
// partitions it no longer holds, and assigned exactly those it gained.
func TestGroupChangesMoveOnlyThePartitionsThatChangeOwner(t *testing.T) {
	t.Parallel()
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("kafka-go's members rebalance eagerly: every member gives up every partition")
	}
	eachProtocol(t, func(t *testing.T, proto consumer.GroupProtocol) {
		const parts = 12
		e := setupProtocol(t, parts, proto)

		var mu sync.Mutex
		var ids []string
		stopLoad := make(chan struct{})
		loadDone := make(chan struct{})
		go func() {
			defer close(loadDone)
			w := e.kafka.Writer(e.topic)
			defer w.Close()
			for round := 0; ; round++ {
				select {
				case <-stopLoad:
					return
				case <-time.After(50 * time.Millisecond):
				}
				msgs := make([]kafka.Message, parts)
				batch := make([]string, parts)
				for p := range parts {
					batch[p] = "r" + strconv.Itoa(round) + "-" + strconv.Itoa(p)
					msgs[p] = msg(p, batch[p], "v")
				}
				if err := w.WriteMessages(context.Background(), msgs...); err != nil {
					t.Errorf("produce: %v", err)
					return
				}
				mu.Lock()
				ids = append(ids, batch...)
				mu.Unlock()
			}
		}()

		type member struct {
			name   string
			holder *partitionHolder
			run    *running
		}
		var members []*member
		startMember := func(name string) {
			h := newPartitionHolder()
			cfg := e.config(e.applyHandler())
			cfg.Hooks = []consumer.Hook{h}
			members = append(members, &member{name: name, holder: h, run: e.start(cfg)})
		}
		type snapshot struct {
			held              []int
			assigned, revoked int
		}
		// settled waits until the running members hold every partition
		// once, as evenly as the count allows, and returns what each holds.
		settled := func(what string) map[string]snapshot {
			out := map[string]snapshot{}
			waitFor(t, 90*time.Second, what, func() bool {
				clear(out)
				seen := map[int]bool{}
				least, most := parts, 0
				for _, m := range members {
					held, a, r := m.holder.state()
					for _, p := range held {
						if seen[p] {
							return false
						}
						seen[p] = true
					}
					least, most = min(least, len(held)), max(most, len(held))
					out[m.name] = snapshot{held, a, r}
				}
				return len(seen) == parts && most-least <= 1
			})
			return out
		}
		// moved requires that each member running before and after a
		// change was revoked just the partitions it gave up and assigned
		// just those it gained.
		moved := func(change string, before, after map[string]snapshot) {
			for name, a := range after {
				b, ok := before[name]
				if !ok {
					continue
				}
				lost, gained := 0, 0
				for _, p := range b.held {
					if !slices.Contains(a.held, p) {
						lost++
					}
				}
				for _, p := range a.held {
					if !slices.Contains(b.held, p) {
						gained++
					}
				}
				require.Equal(t, lost, a.revoked-b.revoked, "%s: revocations of member %s (held %v, then %v)", change, name, b.held, a.held)
				require.Equal(t, gained, a.assigned-b.assigned, "%s: assignments of member %s (held %v, then %v)", change, name, b.held, a.held)
				t.Logf("%s: member %s gave up %d and gained %d partitions", change, name, lost, gained)
			}
		}

		startMember("a")
		startMember("b")
		startMember("c")
		three := settled("three members holding four partitions each")
		startMember("d")
		four := settled("four members holding three partitions each")
		moved("a fourth member joined", three, four)

		members[3].run.stop()
		members = members[:3]
		threeAgain := settled("three members again, the fourth gone")
		moved("the fourth member left", four, threeAgain)

		members[0].run.stop()
		members = members[1:]
		two := settled("two members, the first gone")
		moved("the first member left", threeAgain, two)

		close(stopLoad)
		<-loadDone
		mu.Lock()
		all := slices.Clone(ids)
		mu.Unlock()
		e.waitEffects(len(all), 90*time.Second)
		for _, m := range members {
			m.run.stop()
		}
		e.requireExactlyOnce(all)
		e.check(expectation{ids: all})
	})
}
