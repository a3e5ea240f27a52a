package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kafkaonce/kafkaonce/consumer"
	"github.com/kafkaonce/kafkaonce/internal/store/recorded"
	"github.com/kafkaonce/kafkaonce/internal/testenv"
)

// shareWorld is w with its consumer on a share group (named after it)
// that starts at the log's start.
func shareWorld(t *testing.T, partitions int) *world {
	w := newWorld(t, partitions)
	testenv.RequireShareGroups(t, w.kafka.Brokers)
	admin := testenv.Admin(t, w.kafka.Brokers)
	require.NoError(t, admin.SetShareStart(testenv.Context(t, 10*time.Second), w.name, "earliest"))
	return w
}

func (w *world) effects() int64 {
	return w.db.Int(w.t, `SELECT count(*) FROM `+w.db.Table("effects"))
}

func (w *world) statusJSON() statusReport {
	w.t.Helper()
	out, errOut, code := w.cliBare("status", "--consumer", w.name, "--json")
	require.Equal(w.t, 0, code, errOut+out)
	var r statusReport
	require.NoError(w.t, json.Unmarshal([]byte(out), &r))
	return r
}

// Issue 47: status knows a share group from what the consumer recorded,
// and shows its members, settings and share lag rather than committed
// offsets and positions it has none of.
func TestStatusShowsAShareGroup(t *testing.T) {
	t.Parallel()
	w := shareWorld(t, 2)
	w.produce(10, "s")
	stop := w.runUntil(func(c *consumer.Config) {
		c.GroupType, c.KafkaClient = consumer.ShareGroup, consumer.FranzGo
		c.Handler = w.consumerConfig().Handler
	}, "every record applied", func() bool { return w.effects() == 10 })
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()

	t.Run("its recorded settings say share group", func(t *testing.T) {
		r := w.statusJSON()
		require.Equal(t, recorded.ShareGroup, r.GroupType)
		require.NotNil(t, r.Recorded)
		require.Equal(t, recorded.ShareGroup, r.Recorded.GroupType)
		out, errOut, code := w.cliBare("status", "--consumer", w.name)
		require.Equal(t, 0, code, errOut+out)
		require.Contains(t, out, "(share group "+w.name+")")
		require.Contains(t, out, "group "+w.name+" (a share group), topics")
	})

	t.Run("a running member is listed with the group's settings", func(t *testing.T) {
		var r statusReport
		require.Eventually(t, func() bool { r = w.statusJSON(); return r.Share != nil && len(r.Share.Members) == 1 }, 20*time.Second, 100*time.Millisecond)
		require.Empty(t, r.Share.Error)
		require.Equal(t, 2, r.Share.Members[0].Assigned, "one member shares both partitions")
		require.NotNil(t, r.Share.Settings)
		require.Positive(t, r.Share.Settings.DeliveryLimit)
		require.Equal(t, "earliest", r.Share.Settings.Start)
		require.Equal(t, "read_committed", r.Share.Settings.Isolation, "the member made its group read committed records only")
		out, errOut, code := w.cliBare("status", "--consumer", w.name)
		require.Equal(t, 0, code, errOut+out)
		require.Contains(t, out, "share group members: 1 (state ")
		require.Contains(t, out, "share group settings: delivery limit ")
		require.Contains(t, out, "start earliest, isolation read_committed")
	})

	t.Run("each partition has a share start and share lag, not offsets", func(t *testing.T) {
		var r statusReport
		require.Eventually(t, func() bool {
			r = w.statusJSON()
			for _, p := range r.Partitions {
				if p.ShareLag == nil || p.Lag != 0 {
					return false
				}
			}
			return len(r.Partitions) == 2
		}, 20*time.Second, 100*time.Millisecond, "every record accepted: no share lag")
		for _, p := range r.Partitions {
			require.NotNil(t, p.ShareStart)
			// Kafka persists a share-partition's start offset with the
			// acknowledgement after the one that moves it: the start it
			// reports may trail the records settled, never pass them.
			require.GreaterOrEqual(t, *p.ShareStart, int64(0))
			require.LessOrEqual(t, *p.ShareStart, int64(5), "the start never passes the log end")
			require.EqualValues(t, -1, p.Committed, "a share group commits no offsets")
			require.EqualValues(t, -1, p.Stored, "nor stores positions")
		}
		out, errOut, code := w.cliBare("status", "--consumer", w.name)
		require.Equal(t, 0, code, errOut+out)
		require.Contains(t, out, "SHARE START")
		require.Contains(t, out, "total share lag: 0")
		require.NotContains(t, out, "COMMITTED")
	})

	t.Run("the page shows the consumer, which stores no positions, with its members", func(t *testing.T) {
		srv := w.servePage(w.env(), serveOptions{})
		var body string
		require.Eventually(t, func() bool {
			var res *http.Response
			res, body = get(t, srv, "/")
			require.Equal(t, http.StatusOK, res.StatusCode, body)
			return strings.Contains(body, "share lag 0")
		}, 20*time.Second, 100*time.Millisecond)
		require.Contains(t, body, "share group "+w.name)
		require.Contains(t, body, "1 members")
		require.Contains(t, body, "start earliest, isolation read_committed")
		require.Contains(t, body, "<th>share start</th>")
		require.NotContains(t, body, "<th>committed</th>")
		require.Empty(t, w.db.Int(t, `SELECT count(*) FROM `+w.db.Table("consumer_offsets")))
	})

	t.Run("records not yet delivered are share lag", func(t *testing.T) {
		stop()
		stopped = true
		w.produce(4, "later")
		var r statusReport
		require.Eventually(t, func() bool { r = w.statusJSON(); return r.Share != nil && len(r.Share.Members) == 0 }, 30*time.Second, 100*time.Millisecond,
			"the member left")
		var lag int64
		for _, p := range r.Partitions {
			lag += p.Lag
		}
		require.EqualValues(t, 4, lag)
	})
}

// A consumer group's status names no share group.
func TestStatusOfAConsumerGroupHasNoShareGroup(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	w.produce(2, "c")
	w.consume(nil, 2)
	r := w.statusJSON()
	require.Equal(t, recorded.ConsumerGroup, r.GroupType)
	require.Nil(t, r.Share)
	require.Equal(t, recorded.ConsumerGroup, r.Recorded.GroupType)
}
