package franz

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// topicIDs tells, for one poll's fetches, a topic re-created since a feed
// was opened from a kgo client that still fetches it under the old id.
//
// kgo keeps the id it first learned for a topic name until the topic is
// purged from the client: after a topic is deleted and created again, it
// fetches a partition of the new topic (one opened with the new id, after
// the engine read it from the broker) under the old id, and the broker
// answers UNKNOWN_TOPIC_ID, or kgo labels what it fetched with the old id.
// Either looks like a re-creation to the feed. The broker's own answer
// decides: when the topic's id is the one the feed was opened with, the
// client is stale, not the feed; the topic is purged from the client and
// every feed of it is fetched again from where it was, under the id kgo
// then learns. (A feed opened with the old id then meets the new one, and
// fails as it should.)
type topicIDs struct {
	hub *hub
	ctx context.Context
	// current are the ids the broker gave in this poll, by topic, and
	// purge the topics found stale.
	current map[string]kafkaclient.TopicID
	purge   map[string]bool
}

// stale reports whether what a fetch brought for f (labelled id, or
// failed with err) is the work of a stale client: the topic's id is f's,
// and the fetch's is not.
func (t *topicIDs) stale(f *feed, id kafkaclient.TopicID, err error) bool {
	f.mu.Lock()
	want := f.topicID
	f.mu.Unlock()
	if want.IsZero() || !(want.Differs(id) || errors.Is(err, kerr.UnknownTopicID)) {
		return false
	}
	if t.purge[f.tp.Topic] {
		return true
	}
	current, ok := t.current[f.tp.Topic]
	if !ok {
		ctx, cancel := context.WithTimeout(t.ctx, 10*time.Second)
		current, _, _ = TopicMetadata(ctx, t.hub.cl, f.tp.Topic)
		cancel()
		if t.current == nil {
			t.current = map[string]kafkaclient.TopicID{}
		}
		t.current[f.tp.Topic] = current
	}
	if current != want {
		return false // the topic changed under the feed: its verdict stands
	}
	if t.purge == nil {
		t.purge = map[string]bool{}
	}
	t.purge[f.tp.Topic] = true
	return true
}

// refresh purges the stale topics from the client, and fetches each of
// their feeds again from where it was.
func (t *topicIDs) refresh() {
	h := t.hub
	for topic := range t.purge {
		h.cl.PurgeTopicsFromClient(topic)
		for tp, f := range h.feeds {
			if tp.Topic != topic {
				continue
			}
			h.cl.AddConsumePartitions(map[string]map[int32]kgo.Offset{topic: {int32(tp.Partition): kgo.NewOffset().At(f.resumeAt)}})
			if f.paused.Load() {
				h.cl.PauseFetchPartitions(map[string][]int32{topic: {int32(tp.Partition)}})
			}
		}
	}
}
