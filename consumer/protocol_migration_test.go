package consumer_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// A running group moves from the classic protocol to the consumer protocol
// one member at a time, and back, without applying any message twice or
// skipping one. Three classic members share twelve partitions under steady
// load; each in turn is stopped and started again as a consumer-protocol
// member, then each in turn back as a classic member. After every stop and
// every start the members hold every partition once; the coordinator lists
// the group as a consumer group from the first consumer-protocol member
// on, with the classic members in it, and as a classic group again once
// the last has left. At the end every message produced was applied exactly
// once, the group's offsets and the stored positions are at the log's
// end, and every partition assigned again started at its stored position.
//
// The broker converts the group (Kafka 4.x, group.consumer.migration.policy
// bidirectional); kfake does not, so the test runs only with KAFKA_BROKERS.
// What the broker does with the classic members of a converted group is
// logged, not required: whether a change moved their partitions
// cooperatively, whether a partition was assigned to a member while
// another still held it (the database, not the group, keeps that from
// applying anything twice), and how long each step took.
func TestConsumerProtocolOnlineMigration(t *testing.T) {
	t.Parallel()
	if testenv.KafkaClient() == "kafka-go" {
		t.Skip("the consumer-protocol members need franz-go (a group mixing kafka-go's classic members with them is not tested)")
	}
	const parts = 12
	k := testenv.NewKafka(t)
	testenv.RequireGroupMigration(t, k)
	e := setupOn(t, parts, k)
	// Under the consumer protocol the session and heartbeat are the
	// group's: set before the first consumer-protocol member joins, to the
	// session the classic members ask for (env.config).
	k.ConsumerProtocolGroup(t, e.group)

	load := e.startLoad()
	g := e.groupMembers(t)
	protocols := map[string]consumer.GroupProtocol{}
	start := func(name string, proto consumer.GroupProtocol) {
		protocols[name] = proto
		g.start(name, e.configFor(proto, e.applyHandler()))
	}
	// group waits until the coordinator lists the group as typ with that
	// many members of each protocol.
	group := func(when, typ string, classic, consumerMembers int) {
		t.Helper()
		var got string
		waitFor(t, 30*time.Second, fmt.Sprintf("%s: a %s group of %d classic and %d consumer-protocol members", when, typ, classic, consumerMembers), func() bool {
			got = k.GroupType(t, e.group)
			if got != typ {
				return false
			}
			if typ == "classic" {
				_, members, _, err := k.GroupAssignment(e.group, e.topic)
				return err == nil && members == classic && consumerMembers == 0
			}
			c, n, err := k.ConsumerGroupMembers(t, e.group)
			return err == nil && c == classic && n == consumerMembers
		})
	}
	// report logs what a change did to the members that ran through it.
	report := func(change string, took time.Duration, before, after map[string]snapshot) {
		var lines []string
		for name, m := range moves(before, after) {
			how := "cooperatively"
			if !m.cooperative() {
				how = "eagerly"
			}
			lines = append(lines, fmt.Sprintf("%s (%s) gave up %d and gained %d partitions %s (%d revoked, %d assigned)",
				name, protocols[name], m.lost, m.gained, how, m.revoked, m.assigned))
		}
		t.Logf("%s: settled in %v; %s", change, took.Round(time.Millisecond), strings.Join(lines, "; "))
	}
	// restart stops a member and starts it again under proto, and waits
	// until the group has settled after each.
	restart := func(name string, proto consumer.GroupProtocol, before map[string]snapshot) map[string]snapshot {
		t.Helper()
		began := time.Now()
		g.stop(name)
		two := g.settled(fmt.Sprintf("two members holding every partition, %s (%s) stopped", name, protocols[name]))
		report(fmt.Sprintf("%s (%s) stopped", name, protocols[name]), time.Since(began), before, two)
		began = time.Now()
		start(name, proto)
		three := g.settled(fmt.Sprintf("three members holding every partition, %s back as a %s member", name, proto))
		report(fmt.Sprintf("%s started as a %s member", name, proto), time.Since(began), two, three)
		return three
	}

	names := []string{"a", "b", "c"}
	for _, name := range names {
		start(name, consumer.ClassicProtocol)
	}
	settled := g.settled("three classic members holding every partition")
	group("before", "classic", 3, 0)

	for i, name := range names {
		settled = restart(name, consumer.ConsumerProtocol, settled)
		group(fmt.Sprintf("%s moved to the consumer protocol", name), "consumer", len(names)-1-i, i+1)
	}
	for i, name := range names {
		settled = restart(name, consumer.ClassicProtocol, settled)
		typ, classic, consumerMembers := "consumer", i+1, len(names)-1-i
		if consumerMembers == 0 {
			typ = "classic"
		}
		group(fmt.Sprintf("%s moved back to the classic protocol", name), typ, classic, consumerMembers)
	}

	all := load.stop()
	e.waitEffects(len(all), 90*time.Second)
	g.stopAll()
	e.requireExactlyOnce(all)
	e.check(expectation{ids: all})
	twice := g.owners.twoOwners()
	t.Logf("%d messages applied once each; a partition had two owners at once %d times: %v", len(all), len(twice), twice)

	// Each handover started where the last owner's transactions left the
	// partition: its stored position, whatever the group's offset said.
	behind := 0
	for _, a := range g.owners.starts() {
		if a.StoredPosition < 0 {
			continue // the partition's first start
		}
		require.Equal(t, a.StoredPosition, a.Start, "partition %d started at %d, its stored position is %d (group offset %d)", a.Partition, a.Start, a.StoredPosition, a.KafkaOffset)
		if a.KafkaOffset != a.StoredPosition {
			behind++
		}
	}
	t.Logf("%d assignments, %d with a group offset other than the stored position", len(g.owners.starts()), behind)
}
