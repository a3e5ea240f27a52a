package consumer_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/consumer"
)

// A share group member is ready once it is in its group and polls: a
// member whose polls fail is not ready at once, and not live once they
// have failed for StallAfter.
func TestShareGroupHealth(t *testing.T) {
	e := setupShare(t, shareOptions{fakeOnly: "the polls are refused by kfake's answer to them"})
	// A refused poll answers the topic's partition with an error kgo
	// does not retry. The session's later requests may name no partition,
	// so the answer names the one the first request did.
	var refuse atomic.Bool
	var topicID atomic.Pointer[[16]byte]
	e.fake.ControlKey(int16(kmsg.ShareFetch), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		e.fake.KeepControl()
		req := kr.(*kmsg.ShareFetchRequest)
		if len(req.Topics) > 0 {
			id := req.Topics[0].TopicID
			topicID.Store(&id)
		}
		if !refuse.Load() || topicID.Load() == nil {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ShareFetchResponse)
		rt := kmsg.NewShareFetchResponseTopic()
		rt.TopicID = *topicID.Load()
		rp := kmsg.NewShareFetchResponseTopicPartition()
		rp.Partition, rp.ErrorCode = 0, kerr.TopicAuthorizationFailed.Code
		rt.Partitions = append(rt.Partitions, rp)
		resp.Topics = append(resp.Topics, rt)
		return resp, nil, true
	})
	cfg := e.shareConfig(false, nil)
	cfg.StallAfter = 2 * time.Second
	c, err := consumer.New(e.db.Pool, cfg)
	require.NoError(t, err)
	h := c.Health(context.Background())
	require.False(t, h.Ready, "not running yet")
	e.run(c)

	t.Run("in the group and polling: ready", func(t *testing.T) {
		ids := e.produceIDs("m", 5)
		e.waitEffects(len(ids), 20*time.Second)
		waitFor(t, 10*time.Second, "ready", func() bool { return c.Health(context.Background()).Ready })
		h := c.Health(context.Background())
		require.True(t, h.Live)
		require.True(t, h.InGroup)
		require.Empty(t, h.Problems)
	})

	t.Run("polls failing: not ready, then not live after StallAfter", func(t *testing.T) {
		refuse.Store(true)
		waitFor(t, 10*time.Second, "not ready", func() bool { return !c.Health(context.Background()).Ready })
		h := c.Health(context.Background())
		require.True(t, h.InGroup, "still a member in name")
		require.True(t, h.Live, "not stalled yet")
		require.Contains(t, strings.Join(h.Problems, "\n"), "share group "+e.group+": its polls fail since")
		waitFor(t, 10*time.Second, "not live", func() bool { return !c.Health(context.Background()).Live })
		require.Contains(t, strings.Join(c.Health(context.Background()).Problems, "\n"), "polls have failed for")
	})

	t.Run("polls answered again: ready again", func(t *testing.T) {
		refuse.Store(false)
		waitFor(t, 10*time.Second, "ready again", func() bool { return c.Health(context.Background()).Ready })
	})
}
