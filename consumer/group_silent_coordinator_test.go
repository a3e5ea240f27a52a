package consumer_test

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A group coordinator that stops answering (the whole broker hung) holds no consumer-group
// member's shutdown, under either group protocol, static or not: the
// member's leave has two seconds of its own, as a share group member's
// has, so Run returns within ShutdownTimeout, those two seconds and some
// slack. (kgo retries an unanswered leave for its retry timeout, 30 s;
// a static consumer-protocol member then sent its own leave, bounded by
// 15 s.) Nothing is lost: a member started once the coordinator answers
// again applies every message, each once.
func TestAGroupMemberStopsWhileItsCoordinatorIsSilent(t *testing.T) {
	t.Parallel()
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("the franz-go member's leave (kafka-go's is its own)")
	}
	if os.Getenv("KAFKA_BROKERS") != "" {
		t.Skip("on kfake only: the coordinator's silence is kfake's control")
	}
	// coordinator is every request a group member sends its coordinator.
	coordinator := []kmsg.Key{kmsg.FindCoordinator, kmsg.ConsumerGroupHeartbeat, kmsg.ConsumerGroupDescribe,
		kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup, kmsg.OffsetCommit, kmsg.OffsetFetch}
	for _, static := range []bool{false, true} {
		name := "dynamic"
		if static {
			name = "static"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			eachProtocol(t, func(t *testing.T, proto consumer.GroupProtocol) {
				// A broker of the test's own, whichever the protocol: it
				// falls silent.
				k := testenv.ConsumerProtocolKafka(t)
				e := setupOn(t, 2, k)
				e.protocol = proto
				ids := e.produceIDs("m", 10)
				cfg := e.config(e.applyHandler())
				cfg.ShutdownTimeout = time.Second
				if static {
					cfg.InstanceID = "pod-0"
				}
				r := e.start(cfg)
				e.waitEffects(len(ids), 60*time.Second)

				silent := make(chan struct{})
				var answer sync.Once
				letAnswer := func() { answer.Do(func() { close(silent) }) }
				t.Cleanup(letAnswer)
				fake := e.kafka.Fake
				for _, key := range coordinator {
					// The control function holds the broker's one loop: the
					// whole broker falls silent at the coordinator's first
					// request, as a broker hung on its storage does.
					fake.ControlKey(key.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
						fake.KeepControl()
						<-silent
						return nil, nil, false
					})
				}
				stopsWithin(t, r, cfg.ShutdownTimeout+2*time.Second+5*time.Second)

				letAnswer()
				ids = append(ids, e.produceIDs("later", 4)...)
				r = e.start(cfg)
				e.waitEffects(len(ids), 60*time.Second)
				r.stop()
				e.requireExactlyOnce(ids)
			})
		})
	}
}
