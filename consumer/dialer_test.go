package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// TestDialerReachesEveryKafkaConnection runs against a broker of its own
// that refuses clients without SASL: the group coordinator, the partition
// fetchers and the log-bounds lookups must all use Config.Dialer.
func TestDialerReachesEveryKafkaConnection(t *testing.T) {
	t.Parallel()
	const topic = "secured"
	secured, err := devenv.StartFakeKafka(kfake.EnableSASL(), kfake.Superuser("PLAIN", "ledger", "s3cret"), kfake.SeedTopics(2, topic))
	require.NoError(t, err)
	t.Cleanup(func() { secured.Close() })
	mech := plain.Mechanism{Username: "ledger", Password: "s3cret"}

	w := &kafka.Writer{Addr: kafka.TCP(secured.Brokers...), Topic: topic, Transport: &kafka.Transport{SASL: mech},
		Balancer: kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }), BatchTimeout: time.Millisecond}
	require.NoError(t, w.WriteMessages(context.Background(), msg(0, "s-0", "x"), msg(1, "s-1", "y")))
	require.NoError(t, w.Close())

	db := testenv.NewDB(t)
	e := &env{t: t, db: db, topic: topic, parts: 2, name: "ledger", group: testenv.Name(t, "group"), events: &recorder{}}
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL, topic text NOT NULL, partition int NOT NULL, kafka_offset bigint NOT NULL, value text NOT NULL)`)
	e.kafka = &testenv.Kafka{Kafka: secured}
	cfg := e.config(e.applyHandler())
	cfg.KafkaClient, cfg.Dialer = consumer.KafkaGo, &kafka.Dialer{Timeout: 5 * time.Second, SASLMechanism: mech}

	r := e.start(cfg)
	e.waitEffects(2, 30*time.Second)
	r.stop()
	e.requireExactlyOnce([]string{"s-0", "s-1"})

	// Without the dialer's credentials the same consumer gets nowhere.
	cfg = e.config(e.applyHandler())
	cfg.GroupID += "_anonymous"
	events := &recorder{}
	cfg.Hooks = []consumer.Hook{events}
	r = e.start(cfg)
	stillFor(t, 2*time.Second, "an unauthenticated member must not be assigned partitions", func() bool {
		return len(events.snapshot().assigned) == 0
	})
	r.stop()
}
