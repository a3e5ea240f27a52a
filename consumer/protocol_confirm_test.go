package consumer_test

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A consumer-protocol member whose session ends at the broker while it
// waits to be confirmed (the coordinator not answering the describe for
// longer than the session, as in a coordinator's hiccup right after the
// join) rejoins and processes its partitions: the confirmation never holds
// kgo's group goroutine, which alone can rejoin the group, so a member the
// broker forgot is not waited for forever.
func TestConsumerProtocolMemberForgottenBeforeItIsConfirmed(t *testing.T) {
	t.Parallel()
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("kafka-go speaks only the classic group protocol")
	}
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("on kfake only: the coordinator's answers are steered")
	}
	k := testenv.ConsumerProtocolKafka(t) // a kfake of the test's own
	fake := k.Fake
	// probe is a group only the test describes: its describes reach the
	// broker, and say whether the broker still lists the member.
	const probe = "probe-of-the-test"
	var (
		holding atomic.Bool
		joined  atomic.Value // the member id the broker assigned partitions to
	)
	holding.Store(true)
	fake.ControlKey(int16(kmsg.ConsumerGroupDescribe), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		req := kreq.(*kmsg.ConsumerGroupDescribeRequest)
		for _, g := range req.Groups {
			if g == probe {
				return nil, nil, false
			}
		}
		if !holding.Load() {
			return nil, nil, false
		}
		// The coordinator does not answer the question: the group, as
		// if the member were not in it yet.
		resp := req.ResponseKind().(*kmsg.ConsumerGroupDescribeResponse)
		for _, g := range req.Groups {
			rg := kmsg.NewConsumerGroupDescribeResponseGroup()
			rg.Group, rg.State = g, "Reconciling"
			resp.Groups = append(resp.Groups, rg)
		}
		return resp, nil, true
	})
	fake.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		fake.KeepControl()
		req := kreq.(*kmsg.ConsumerGroupHeartbeatRequest)
		if !holding.Load() || req.MemberEpoch <= 0 {
			return nil, nil, false
		}
		// The member heartbeats; the broker does not hear it, and its
		// session runs out there.
		joined.CompareAndSwap(nil, req.MemberID)
		resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
		resp.MemberID = &req.MemberID
		resp.MemberEpoch = req.MemberEpoch
		resp.HeartbeatIntervalMillis = 250
		return resp, nil, true
	})

	e := setupOn(t, 1, k)
	e.protocol = consumer.ConsumerProtocol
	ids := e.produceIDs("m", 5)
	r := e.start(e.config(e.applyHandler()))
	waitFor(t, 30*time.Second, "the member joined, and heartbeats the broker does not hear", func() bool { return joined.Load() != nil })
	admin := kadm.NewClient(e.kafka.Client(t))
	waitFor(t, 30*time.Second, "the broker forgot the member", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		described, err := admin.DescribeConsumerGroups(ctx, e.group, probe)
		if err != nil {
			return false
		}
		for _, m := range described[e.group].Members {
			if m.MemberID == joined.Load().(string) {
				return false
			}
		}
		return true
	})
	// The coordinator answers again, about a group that no longer has the
	// member.
	holding.Store(false)
	e.waitEffects(len(ids), 60*time.Second)
	r.stop()
	e.requireExactlyOnce(ids)
}
