package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// consumerProtocolWorld is a world on testenv.ConsumerProtocolKafkaSession's
// broker, whose consumer's group (named after it) has the session sessionMs.
func consumerProtocolWorld(t *testing.T, partitions int, sessionMs string) *world {
	db := testenv.NewDB(t)
	db.Exec(t, `CREATE TABLE `+db.Table("effects")+` (message_id text NOT NULL)`)
	k := testenv.ConsumerProtocolKafkaSession(t, sessionMs)
	w := &world{t: t, db: db, kafka: k, topic: k.Topic(t, partitions), name: testenv.Name(t, "c")}
	k.ConsumerProtocolGroup(t, w.name)
	return w
}

// underConsumerProtocol makes a consumer a member of the consumer group
// protocol (KIP-848): its session and heartbeat are the group's.
func underConsumerProtocol(c *consumer.Config) {
	c.GroupProtocol, c.KafkaClient = consumer.ConsumerProtocol, consumer.FranzGo
	c.SessionTimeout, c.HeartbeatInterval = 0, 0
}

func (w *world) groupMembers() []kafkaadmin.Member {
	w.t.Helper()
	g, err := testenv.Admin(w.t, w.kafka.Brokers).DescribeGroup(context.Background(), w.name)
	require.NoError(w.t, err)
	return g.Members
}

// A consumer-protocol group's running members are its members to the
// tools as a classic group's are: status and the page list them with
// their epochs and partitions, and replay and positions refuse to move a
// group they are in (the classic describe, all the tools asked before,
// does not know such a group: it looked empty, and replay rewound it).
func TestConsumerProtocolGroupMembers(t *testing.T) {
	t.Parallel()
	w := consumerProtocolWorld(t, 2, testenv.ConsumerProtocolSessionMs)
	w.produce(10, "p")
	stop := w.runUntil(func(c *consumer.Config) {
		underConsumerProtocol(c)
		c.Handler = w.consumerConfig().Handler
	}, "every message applied", func() bool { return w.effects() == 10 })
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	// Having applied every message, the member holds both partitions.

	t.Run("status shows the members with their epochs and partitions", func(t *testing.T) {
		r := w.statusJSON()
		g := r.ConsumerGroup
		require.NotNil(t, g)
		require.Len(t, g.Members, 1)
		require.Empty(t, g.Error)
		require.Equal(t, "consumer", g.Protocol)
		require.Positive(t, g.Epoch)
		m := g.Members[0]
		require.Equal(t, "consumer", m.Type)
		require.Positive(t, m.Epoch)
		require.Equal(t, map[string][]int{w.topic: {0, 1}}, m.Assigned)
		out, errOut, code := w.cliBare("status", "--consumer", w.name)
		require.Equal(t, 0, code, errOut+out)
		require.Contains(t, out, "group members: 1 (consumer protocol, state Stable, group epoch ")
		require.Contains(t, out, m.ID+", client ")
		require.Contains(t, out, ", consumer protocol, epoch ")
		require.Contains(t, out, "assigned "+w.topic+" 0,1\n")
	})

	t.Run("the page shows them", func(t *testing.T) {
		members := w.groupMembers()
		require.Len(t, members, 1)
		srv := w.servePage(w.env(), serveOptions{})
		res, body := get(t, srv, "/")
		require.Equal(t, http.StatusOK, res.StatusCode, body)
		require.Contains(t, body, "group, consumer protocol, group epoch ")
		require.Contains(t, body, "<td>"+members[0].ID+"</td>")
		require.Contains(t, body, "<td>"+w.topic+" 0,1</td>")
	})

	t.Run("replay and positions refuse while a member runs, and name it", func(t *testing.T) {
		for _, args := range [][]string{
			{"replay", "--consumer", w.name, "--yes"},
			{"positions", "reset", "--consumer", w.name, "--to", "earliest", "--yes"},
		} {
			out, errOut, code := w.cli(args...)
			require.Equal(t, 2, code, out+errOut)
			require.Contains(t, out, "1 active members", "the plan's heading")
			require.Contains(t, errOut, "group "+w.name+" has 1 active member(s), member ")
			require.Contains(t, errOut, "consumer protocol, epoch ")
			require.Contains(t, errOut, "assigned "+w.topic+" 0,1): stop the consumers first")
		}
		require.EqualValues(t, 5, w.position(0), "nothing rewound")
	})

	t.Run("once the member stopped, replay rewinds the group", func(t *testing.T) {
		stop()
		stopped = true
		waitUntil(t, time.Minute, "the member to leave the group", func() bool { return len(w.groupMembers()) == 0 })
		out, errOut, code := w.cli("replay", "--consumer", w.name, "--yes")
		require.Equal(t, 0, code, out+errOut)
		require.Contains(t, out, "group "+w.name+" rewound on "+w.topic)
	})
}

// A static member of a consumer-protocol group (Config.InstanceID) stays
// in the group after its worker stops, as under the classic protocol:
// replay names it as static, with the group's session timeout, and
// --remove-static-members removes it where the broker lets it (Kafka 4.x
// does) or says why not.
func TestConsumerProtocolStaticMember(t *testing.T) {
	t.Parallel()
	w := consumerProtocolWorld(t, 1, "60000") // outlasts the test: only a removal ends it
	w.produce(4, "s")
	static := func(c *consumer.Config) {
		underConsumerProtocol(c)
		c.InstanceID = "ledger-0"
	}
	w.consumeWith(static, 4)
	members := w.groupMembers()
	require.Len(t, members, 1, "the stopped static member is still in the group")
	require.Equal(t, "ledger-0", members[0].InstanceID)
	require.Equal(t, kafkaadmin.ConsumerProtocol, members[0].Type)

	out, errOut, code := w.cli("replay", "--consumer", w.name, "--yes")
	require.Equal(t, 2, code, errOut)
	require.Contains(t, out, "1 active members, static: ledger-0")
	require.Contains(t, errOut, "1 of them static: instance ledger-0 (client ")
	require.Contains(t, errOut, "consumer protocol, epoch ")
	require.Contains(t, errOut, "the group's consumer.session.timeout.ms")

	out, errOut, code = w.cli("replay", "--consumer", w.name, "--yes", "--remove-static-members")
	if w.kafka.Fake != nil {
		require.Equal(t, 2, code, out+errOut)
		require.Contains(t, errOut, "the broker does not remove a static member of the consumer group protocol by its instance id")
		require.Len(t, w.groupMembers(), 1, "nothing removed")
		return
	}
	require.Equal(t, 0, code, out+errOut)
	require.Contains(t, out, "removed static member(s) ledger-0 from group "+w.name)
	require.Contains(t, out, "group "+w.name+" rewound on "+w.topic)
	require.Empty(t, w.groupMembers())
}
