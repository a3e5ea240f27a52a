package engine

import (
	"context"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// shareEvent calls the share hooks (consumer.HookShareEvent) for what
// befell record id. Each of these is logged where it happens as well; the
// hooks are what lets promhooks and otelhooks count them, since a lock
// lost or a letter left standing is otherwise seen only by someone reading
// the log.
func (s *shareMember) shareEvent(ctx context.Context, kind kafkaoncetype.ShareEventKind, id kafkaclient.RecordID, err error) {
	if len(s.hooks.Share) == 0 {
		return
	}
	e := kafkaoncetype.ShareEvent{Kind: kind, Topic: id.Topic, Partition: id.Partition, Offset: id.Offset, Err: err}
	for _, h := range s.hooks.Share {
		h(ctx, e)
	}
}

// delivered reports the records a poll handed the member, each with its
// delivery count: Kafka reports no record's count, so these events are
// where an operator sees records delivered again and again.
func (s *shareMember) delivered(ctx context.Context, recs []kafkaclient.ShareRecord) {
	if len(s.hooks.Share) == 0 {
		return
	}
	for i := range recs {
		e := kafkaoncetype.ShareEvent{Kind: kafkaoncetype.ShareDelivered, Topic: recs[i].Topic, Partition: recs[i].Partition,
			Offset: recs[i].Offset, DeliveryCount: recs[i].DeliveryCount}
		for _, h := range s.hooks.Share {
			h(ctx, e)
		}
	}
}
