package kafkaadmin_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// member runs a franz-go member of group reading topic, under the
// consumer protocol or the classic one, static when instance is set, until
// stop (or the test's end) closes it: a static member then stays in the
// group, as it does when kafkaonce's worker stops.
func member(t *testing.T, brokers []string, group, topic string, consumerProtocol bool, instance string) (stop func()) {
	t.Helper()
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer())}
	if consumerProtocol {
		opts = append(opts, kgo.ServerSideBalancer())
	} else {
		opts = append(opts, kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond))
	}
	if instance != "" {
		opts = append(opts, kgo.InstanceID(instance))
	}
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !cl.PollFetches(context.Background()).IsClientClosed() {
		}
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cl.Close()
			<-done
		}
	}
	t.Cleanup(stop)
	return stop
}

// describeUntil describes group until cond holds of what Kafka says.
func describeUntil(t *testing.T, admin *kafkaadmin.Admin, group, what string, cond func(kafkaadmin.Group) bool) kafkaadmin.Group {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		g, err := admin.DescribeGroup(context.Background(), group)
		require.NoError(t, err)
		if cond(g) {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last described %+v", what, g)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holding reports whether g has n members, each holding some of topic's
// partitions and all of them between them.
func holding(g kafkaadmin.Group, n int, topic string, partitions int) bool {
	held := 0
	for _, m := range g.Members {
		if len(m.Assigned[topic]) == 0 {
			return false
		}
		held += len(m.Assigned[topic])
	}
	return len(g.Members) == n && held == partitions
}

// DescribeGroup describes a group whichever protocol it speaks: a
// consumer-protocol group (which the classic describe does not know) with
// its group epoch and each member's epoch, type, instance id and
// assignment by topic name; a classic group as before; and a group in
// migration with its classic members among the others.
func TestDescribeGroupConsumerProtocol(t *testing.T) {
	t.Parallel()
	k := testenv.ConsumerProtocolKafka(t)
	admin := testenv.Admin(t, k.Brokers)

	t.Run("a consumer group's members, epochs and assignment", func(t *testing.T) {
		t.Parallel()
		topic, group := k.Topic(t, 3), k.Group(t)
		k.ConsumerProtocolGroup(t, group)
		member(t, k.Brokers, group, topic, true, "")
		stopStatic := member(t, k.Brokers, group, topic, true, "ledger-0")
		g := describeUntil(t, admin, group, "both members holding the three partitions", func(g kafkaadmin.Group) bool { return holding(g, 2, topic, 3) })
		require.Equal(t, kafkaadmin.ConsumerProtocol, g.Protocol)
		require.Positive(t, g.Epoch)
		require.Equal(t, "ledger-0", g.Members[1].InstanceID, "the static member, instance id as ConsumerGroupDescribe reports it")
		for _, m := range g.Members {
			require.Equal(t, kafkaadmin.ConsumerProtocol, m.Type)
			require.Positive(t, m.Epoch)
			require.NotEmpty(t, m.ID)
			require.Len(t, m.Assigned, 1, "the one topic, by name")
		}

		stopStatic()
		g, err := admin.DescribeGroup(context.Background(), group)
		require.NoError(t, err)
		require.Len(t, g.Members, 2)
		require.Equal(t, "ledger-0", g.Members[1].InstanceID, "a static member stays in the group after its worker stops, until its session timeout")
		err = admin.RemoveStatic(context.Background(), group, []string{"ledger-0"})
		if k.Fake != nil {
			require.ErrorContains(t, err, "UNKNOWN_MEMBER_ID", "kfake does not remove a consumer-protocol static member by its instance id")
			return
		}
		require.NoError(t, err, "Kafka removes a consumer-protocol static member by its instance id (LeaveGroup)")
		describeUntil(t, admin, group, "the static member removed", func(g kafkaadmin.Group) bool { return len(g.Members) == 1 && g.Members[0].InstanceID == "" })
	})

	t.Run("a classic group as before", func(t *testing.T) {
		t.Parallel()
		topic, group := k.Topic(t, 3), k.Group(t)
		member(t, k.Brokers, group, topic, false, "ledger-0")
		g := describeUntil(t, admin, group, "the member holding the three partitions", func(g kafkaadmin.Group) bool { return holding(g, 1, topic, 3) })
		require.Equal(t, kafkaadmin.ClassicProtocol, g.Protocol)
		require.Zero(t, g.Epoch)
		m := g.Members[0]
		require.Equal(t, kafkaadmin.ClassicProtocol, m.Type)
		require.Equal(t, "ledger-0", m.InstanceID)
		require.Zero(t, m.Epoch, "a classic member has no epoch")
		require.Equal(t, map[string][]int{topic: {0, 1, 2}}, m.Assigned)
	})

	t.Run("a group the broker does not know", func(t *testing.T) {
		t.Parallel()
		g, err := admin.DescribeGroup(context.Background(), k.Group(t))
		require.NoError(t, err)
		require.Equal(t, kafkaadmin.Group{State: "Dead"}, g)
	})

	t.Run("a consumer group with a classic member, mid-migration", func(t *testing.T) {
		t.Parallel()
		if k.Fake != nil {
			t.Skip("on Kafka only: kfake does not let classic members join a consumer group")
		}
		topic, group := k.Topic(t, 2), k.Group(t)
		k.ConsumerProtocolGroup(t, group)
		member(t, k.Brokers, group, topic, true, "")
		describeUntil(t, admin, group, "the consumer-protocol member holding both partitions", func(g kafkaadmin.Group) bool { return holding(g, 1, topic, 2) })
		member(t, k.Brokers, group, topic, false, "")
		g := describeUntil(t, admin, group, "a member of each protocol, one partition each", func(g kafkaadmin.Group) bool {
			return holding(g, 2, topic, 2)
		})
		require.Equal(t, kafkaadmin.ConsumerProtocol, g.Protocol)
		types := map[string]int{}
		for _, m := range g.Members {
			types[m.Type]++
			require.Positive(t, m.Epoch)
		}
		require.Equal(t, map[string]int{kafkaadmin.ClassicProtocol: 1, kafkaadmin.ConsumerProtocol: 1}, types)
	})
}

// A broker that serves no consumer groups describes classic groups as
// before: Kafka 3.9 answers ConsumerGroupDescribe UNSUPPORTED_VERSION, and
// to a broker that does not advertise it kgo sends nothing and fails the
// request. An empty group (offsets committed, no member) is the one whose
// describe asks both.
func TestDescribeGroupConsumerProtocolNotServed(t *testing.T) {
	t.Parallel()
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("on kfake only: brokers of the test's own, serving consumer groups in part or not at all")
	}
	tooOld := kversion.V3_6_0()
	tooOld.SetMaxKeyVersion(int16(kmsg.ConsumerGroupHeartbeat), -1)
	tooOld.SetMaxKeyVersion(int16(kmsg.ConsumerGroupDescribe), -1)
	for _, c := range []struct {
		name  string
		opts  []kfake.Opt
		after func(*kfake.Cluster)
	}{
		{"not advertised", []kfake.Opt{kfake.MaxVersions(tooOld)}, nil},
		{"answered UNSUPPORTED_VERSION, as Kafka 3.9 does", nil, func(c *kfake.Cluster) {
			c.ControlKey(int16(kmsg.ConsumerGroupDescribe), func(req kmsg.Request) (kmsg.Response, error, bool) {
				c.KeepControl()
				resp := req.ResponseKind().(*kmsg.ConsumerGroupDescribeResponse)
				for _, g := range req.(*kmsg.ConsumerGroupDescribeRequest).Groups {
					rg := kmsg.NewConsumerGroupDescribeResponseGroup()
					rg.Group, rg.ErrorCode = g, 35 // UNSUPPORTED_VERSION
					resp.Groups = append(resp.Groups, rg)
				}
				return resp, nil, true
			})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			k, err := devenv.StartFakeKafka(c.opts...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = k.Close() })
			if c.after != nil {
				c.after(k.Fake)
			}
			tk := &testenv.Kafka{Kafka: k}
			admin := testenv.Admin(t, k.Brokers)
			topic, group := tk.Topic(t, 1), tk.Group(t)
			tk.CommitGroupOffsets(t, group, topic, map[int]int64{0: 0})
			g, err := admin.DescribeGroup(context.Background(), group)
			require.NoError(t, err)
			require.Equal(t, kafkaadmin.Group{State: "Empty", Protocol: kafkaadmin.ClassicProtocol}, g)

			member(t, k.Brokers, group, topic, false, "")
			describeUntil(t, admin, group, "the classic member", func(g kafkaadmin.Group) bool { return holding(g, 1, topic, 1) })
		})
	}
}
