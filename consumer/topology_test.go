package consumer_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// addPartitions grows the test's topic to n partitions.
func (e *env) addPartitions(n int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(e.kafka.Client(e.t)).UpdatePartitions(ctx, n, e.topic)
	require.NoError(e.t, err)
	require.NoError(e.t, resp.Error())
	waitFor(e.t, 30*time.Second, "the new partitions to have leaders", func() bool {
		parts, err := kadm.NewClient(e.kafka.Client(e.t)).ListTopics(ctx, e.topic)
		return err == nil && len(parts[e.topic].Partitions) == n && parts[e.topic].Partitions.NumReplicas() > 0
	})
	e.parts = n
}

// produceTo writes ids "<prefix>-<partition>-i", n to each of partitions.
func (e *env) produceTo(prefix string, n int, partitions ...int) []string {
	e.t.Helper()
	var ids []string
	var msgs []kafka.Message
	for _, p := range partitions {
		for i := range n {
			id := fmt.Sprintf("%s-%d-%d", prefix, p, i)
			ids = append(ids, id)
			msgs = append(msgs, msg(p, id, "v-"+id))
		}
	}
	e.kafka.Produce(e.t, e.topic, msgs...)
	return ids
}

// Partitions added to a topic while the consumer runs are assigned within
// MetadataMaxAge and processed from their first message, whatever
// StartOffset says: they did not exist when the consumer first started on
// the topic, so every message in them came after that start.
func TestPartitionsAddedWhileRunning(t *testing.T) {
	t.Parallel()
	for _, start := range []consumer.StartOffset{consumer.StartEarliest, consumer.StartLatest} {
		t.Run(map[consumer.StartOffset]string{consumer.StartEarliest: "StartEarliest", consumer.StartLatest: "StartLatest"}[start], func(t *testing.T) {
			t.Parallel()
			e := setup(t, 2)
			cfg := e.config(e.applyHandler())
			cfg.StartOffset, cfg.MetadataMaxAge = start, time.Second
			r := e.start(cfg)
			waitFor(t, 30*time.Second, "both partitions assigned", func() bool { _, holding := e.events.assignments(); return holding == 2 })
			ids := e.produceTo("before", 3, 0, 1)
			e.waitEffects(len(ids), 30*time.Second)

			e.addPartitions(4)
			// Written before the consumer can know of the new partitions.
			ids = append(ids, e.produceTo("added", 3, 2, 3)...)
			e.waitEffects(len(ids), 60*time.Second)
			r.stop()
			e.check(expectation{ids: ids})
		})
	}
}

// A topic deleted and re-created under a running consumer: its partition
// stops with ErrTopicRecreated, and none of the new topic's messages
// is applied or passed over in silence.
func TestATopicRecreatedWhileRunningStopsItsPartition(t *testing.T) {
	t.Parallel()
	e := setup(t, 1)
	old := e.produceIDs("old", 20)
	cfg := e.config(e.applyHandler())
	cfg.MetadataMaxAge = time.Second
	r := e.start(cfg)
	e.waitCommitted(map[int]int64{0: 20}, 30*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, devenv.DeleteTopic(ctx, e.kafka.Brokers, e.topic))
	require.NoError(t, devenv.CreateTopic(ctx, e.kafka.Brokers, e.topic, 1))
	e.produceIDs("new", 10)
	waitFor(t, 60*time.Second, "the partition stopped", func() bool { return e.events.stoppedWith(consumer.ErrTopicRecreated) })
	r.stop()
	e.requireExactlyOnce(old)
	require.Equal(t, map[int]int64{0: 20}, e.storedPositions(), "the stored position stays where the old topic's messages ended")
}

// A member joining or leaving moves only the partitions that change owner:
// under either protocol a member that keeps a partition is never made to
// give it up and take it back. Three members share twelve partitions under
// steady load, a fourth joins, leaves, and one of the three leaves; after
// each change every member still running was revoked exactly the
// partitions it no longer holds, and assigned exactly those it gained.
func TestRebalancesMoveOnlyThePartitionsThatChangeOwner(t *testing.T) {
	t.Parallel()
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("kafka-go's members rebalance eagerly: every member gives up every partition")
	}
	eachProtocol(t, func(t *testing.T, proto consumer.GroupProtocol) {
		const parts = 12
		e := setupProtocol(t, parts, proto)
		load := e.startLoad()
		g := e.groupMembers(t)
		// moved requires that each member running before and after a
		// change was revoked just the partitions it gave up and assigned
		// just those it gained.
		moved := func(change string, before, after map[string]snapshot) {
			for name, m := range moves(before, after) {
				require.Equal(t, m.lost, m.revoked, "%s: revocations of member %s (held %v, then %v)", change, name, m.before, m.after)
				require.Equal(t, m.gained, m.assigned, "%s: assignments of member %s (held %v, then %v)", change, name, m.before, m.after)
				t.Logf("%s: member %s gave up %d and gained %d partitions", change, name, m.lost, m.gained)
			}
		}

		for _, name := range []string{"a", "b", "c"} {
			g.start(name, e.config(e.applyHandler()))
		}
		three := g.settled("three members holding four partitions each")
		g.start("d", e.config(e.applyHandler()))
		four := g.settled("four members holding three partitions each")
		moved("a fourth member joined", three, four)

		g.stop("d")
		threeAgain := g.settled("three members again, the fourth gone")
		moved("the fourth member left", four, threeAgain)

		g.stop("a")
		two := g.settled("two members, the first gone")
		moved("the first member left", threeAgain, two)

		all := load.stop()
		e.waitEffects(len(all), 90*time.Second)
		g.stopAll()
		e.requireExactlyOnce(all)
		e.check(expectation{ids: all})
	})
}

// A static member (InstanceID) restarted within SessionTimeout gets its
// partitions back without a rebalance: the other member keeps its own and
// hears of no assignment or revocation.
func TestAStaticMemberRestartedWithinTheSessionCausesNoRebalance(t *testing.T) {
	t.Parallel()
	if kafkaClient() == consumer.KafkaGo {
		t.Skip("kafka-go has no static membership: New refuses InstanceID with it")
	}
	eachProtocol(t, func(t *testing.T, proto consumer.GroupProtocol) {
		staticMemberRestarted(t, setupProtocol(t, 4, proto, protocolOptions{session: staticSession}))
	})
}

// staticSession is the session a static member's restart fits in.
const staticSession = 20 * time.Second

func staticMemberRestarted(t *testing.T, e *env) {
	recs := make([]*recorder, 2)
	runs := make([]*running, 2)
	startMember := func(i int) {
		recs[i] = &recorder{}
		cfg := e.config(e.applyHandler())
		cfg.InstanceID = "member-" + strconv.Itoa(i)
		if e.protocol == consumer.ClassicProtocol {
			cfg.SessionTimeout = staticSession
		}
		cfg.Hooks = []consumer.Hook{recs[i]}
		runs[i] = e.start(cfg)
	}
	startMember(0)
	startMember(1)
	holding := func(i int) int { _, h := recs[i].assignments(); return h }
	waitFor(t, 60*time.Second, "2 members holding 2 partitions each", func() bool { return holding(0) == 2 && holding(1) == 2 })
	ids := e.produceIDs("a", 40)
	e.waitEffects(len(ids), 30*time.Second)
	settledAssigned, _ := recs[0].assignments()

	runs[1].stop()
	startMember(1)
	waitFor(t, 30*time.Second, "the restarted member holding its 2 partitions", func() bool { return holding(1) == 2 })
	ids = append(ids, e.produceIDs("b", 40)...)
	e.waitEffects(len(ids), 30*time.Second)
	assigned, held := recs[0].assignments()
	require.Equal(t, settledAssigned, assigned, "the member that stayed was assigned partitions again")
	require.Equal(t, 2, held, "the member that stayed gave up a partition")
	for _, r := range runs {
		r.stop()
	}
	e.check(expectation{ids: ids})
}
