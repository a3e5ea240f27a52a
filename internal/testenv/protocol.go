package testenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
)

// RequireConsumerProtocol skips the test unless brokers serve the consumer
// group protocol (KIP-848) as kgo speaks it: ConsumerGroupHeartbeat v1
// among their ApiVersions (Kafka 4.0 and later; 3.9 serves v0 at most, and
// only when enabled). The brokers are asked once per broker list.
func RequireConsumerProtocol(tb testing.TB, brokers []string) {
	tb.Helper()
	if err := consumerProtocolOffer(tb, brokers); err != nil {
		tb.Skipf("the consumer group protocol is not tested on %v: %v", brokers, err)
	}
}

// ConsumerProtocolServed reports whether brokers serve the consumer group
// protocol (see RequireConsumerProtocol).
func ConsumerProtocolServed(tb testing.TB, brokers []string) bool {
	tb.Helper()
	return consumerProtocolOffer(tb, brokers) == nil
}

func consumerProtocolOffer(tb testing.TB, brokers []string) error {
	tb.Helper()
	for _, k := range apiVersions(tb, brokers).ApiKeys {
		if k.ApiKey == kmsg.ConsumerGroupHeartbeat.Int16() && k.MaxVersion >= 1 {
			return nil
		}
	}
	return errors.New("the broker serves no ConsumerGroupHeartbeat v1: the consumer group protocol needs Kafka 4.0 or later")
}

// RequireGroupMigration skips the test unless k's brokers convert a group
// between the classic and the consumer protocol while it has members, both
// ways: a consumer-protocol member joining a classic group with members
// makes it a consumer group, and the last one leaving makes it classic
// again. Kafka 4.x does so under group.consumer.migration.policy
// "bidirectional" (its default); kfake does not (it answers the first
// consumer-protocol member of a classic group with members
// GROUP_ID_NOT_FOUND).
func RequireGroupMigration(tb testing.TB, k *Kafka) {
	tb.Helper()
	if k.Fake != nil {
		tb.Skip("the in-process broker (kfake) does not migrate a group with classic members to the consumer protocol: set KAFKA_BROKERS to a Kafka 4.x broker")
	}
	RequireConsumerProtocol(tb, k.Brokers)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(k.Client(tb))
	brokers, err := adm.ListBrokers(ctx)
	if err != nil || len(brokers) == 0 {
		tb.Fatalf("testenv: list the brokers of %v: %v", k.Brokers, err)
	}
	configs, err := adm.DescribeBrokerConfigs(ctx, brokers.NodeIDs()...)
	if err != nil {
		tb.Fatalf("testenv: describe the configs of the brokers of %v: %v", k.Brokers, err)
	}
	for _, rc := range configs {
		if rc.Err != nil {
			tb.Fatalf("testenv: describe the configs of broker %s: %v", rc.Name, rc.Err)
		}
		policy := ""
		for _, c := range rc.Configs {
			if c.Key == migrationPolicy {
				policy = c.MaybeValue()
			}
		}
		if !strings.EqualFold(policy, "bidirectional") {
			tb.Skipf("broker %s has %s=%q: it does not migrate a group with members both ways (bidirectional)", rc.Name, migrationPolicy, policy)
		}
	}
}

const migrationPolicy = "group.consumer.migration.policy"

// GroupType returns the type of group the coordinator lists group as:
// "classic" or "consumer" (a consumer group of the consumer protocol,
// perhaps with classic members), or "" when it lists no such group.
func (k *Kafka) GroupType(tb testing.TB, group string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	adm := kadm.NewClient(k.Client(tb))
	for _, typ := range []string{"classic", "consumer"} {
		listed, err := adm.ListGroupsByType(ctx, []string{typ})
		if err != nil {
			tb.Fatalf("testenv: list the %s groups: %v", typ, err)
		}
		if _, ok := listed[group]; ok {
			return typ
		}
	}
	return ""
}

// ConsumerGroupMembers returns how many members of a consumer group (one
// of the consumer protocol) speak each protocol, as its coordinator
// describes them: classic members (JoinGroup and SyncGroup, in a group
// converted while they were in it) and consumer-protocol members.
func (k *Kafka) ConsumerGroupMembers(tb testing.TB, group string) (classic, consumer int, err error) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	described, err := kadm.NewClient(k.Client(tb)).DescribeConsumerGroups(ctx, group)
	if err == nil {
		err = described.Error()
	}
	if err != nil {
		return 0, 0, err
	}
	for _, m := range described[group].Members {
		switch m.MemberType {
		case 0:
			classic++
		case 1:
			consumer++
		default:
			return 0, 0, fmt.Errorf("testenv: member %s of group %s is of an unknown type %d (ConsumerGroupDescribe before v1)", m.MemberID, group, m.MemberType)
		}
	}
	return classic, consumer, nil
}

// Under the consumer protocol a group's session and heartbeat are the
// broker's to set: the tests give their groups a session of 6s, the one
// their classic members ask for, and a short heartbeat, so that
// partitions move within a second or two.
const (
	ConsumerProtocolSessionMs   = "6000"
	ConsumerProtocolHeartbeatMs = "250"
)

// ConsumerProtocolKafka is the broker for a test of consumer-protocol
// groups. With KAFKA_BROKERS set it is the test binary's broker, and the
// test is skipped unless the broker serves the protocol; else a kfake of
// the test's own, with the session and heartbeat as its broker configs
// (kfake takes a group's heartbeat from those alone). Give each group the
// test uses ConsumerProtocolGroup.
func ConsumerProtocolKafka(tb testing.TB) *Kafka {
	tb.Helper()
	return ConsumerProtocolKafkaSession(tb, ConsumerProtocolSessionMs)
}

// ConsumerProtocolKafkaSession is ConsumerProtocolKafka with the groups'
// session timeout sessionMs: a test of static members, which stay in
// their group until it passes, makes it outlast the test (Kafka's
// group.consumer.max.session.timeout.ms is 60000 by default).
func ConsumerProtocolKafkaSession(tb testing.TB, sessionMs string) *Kafka {
	tb.Helper()
	if os.Getenv("KAFKA_BROKERS") != "" {
		k := NewKafka(tb)
		RequireConsumerProtocol(tb, k.Brokers)
		k.consumerSessionMs = sessionMs
		return k
	}
	k, err := devenv.StartFakeKafka(kfake.BrokerConfigs(map[string]string{
		"group.consumer.session.timeout.ms":    sessionMs,
		"group.consumer.heartbeat.interval.ms": ConsumerProtocolHeartbeatMs,
	}))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() { _ = k.Close() })
	return &Kafka{Kafka: k, consumerSessionMs: sessionMs}
}

// ConsumerProtocolGroup gives group the tests' session and heartbeat, as
// its group configs, on a broker of ConsumerProtocolKafka that is not a
// kfake of the test's own (which has them as broker configs).
func (k *Kafka) ConsumerProtocolGroup(tb testing.TB, group string) {
	tb.Helper()
	if k.Fake != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := franz.SetGroupConfigs(ctx, k.Client(tb), group, map[string]string{
		"consumer.session.timeout.ms":    cmp.Or(k.consumerSessionMs, ConsumerProtocolSessionMs),
		"consumer.heartbeat.interval.ms": ConsumerProtocolHeartbeatMs,
	}); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
}
