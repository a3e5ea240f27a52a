package kafkago

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/segmentio/kafka-go"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// genOffsets are the group's committed offsets of a generation's
// partitions. kafka-go hands out a generation's offsets without the
// metadata committed with them, which the engine needs (see
// internal/commitmark), so they are read again, offsets and metadata
// together, in one OffsetFetch for all the generation's partitions: made
// by the first worker that asks, which the others wait for. A failed read
// is made again by the next one to ask.
type genOffsets struct {
	parts map[string][]int

	mu  sync.Mutex
	got map[kafkaclient.TopicPartition]kafkaclient.CommittedOffset
}

func (g *genOffsets) read(ctx context.Context, c *Client, tp kafkaclient.TopicPartition) (kafkaclient.CommittedOffset, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.got == nil {
		got, err := g.fetch(ctx, c)
		if err != nil {
			return kafkaclient.CommittedOffset{}, err
		}
		g.got = got
	}
	o, ok := g.got[tp]
	if !ok {
		return kafkaclient.CommittedOffset{}, fmt.Errorf("%w: %s/%d is not assigned to this member", kafkaclient.ErrFenced, tp.Topic, tp.Partition)
	}
	return o, nil
}

func (g *genOffsets) fetch(ctx context.Context, c *Client) (map[kafkaclient.TopicPartition]kafkaclient.CommittedOffset, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	resp, err := c.admin.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: c.cfg.Group.ID, Topics: g.parts})
	if err == nil && resp.Error != nil && !errors.Is(resp.Error, kafka.GroupIdNotFound) {
		err = resp.Error
	}
	if err != nil {
		return nil, fmt.Errorf("kafkago: committed offsets of group %s: %w", c.cfg.Group.ID, err)
	}
	out := map[kafkaclient.TopicPartition]kafkaclient.CommittedOffset{}
	for topic, ps := range g.parts {
		for _, p := range ps {
			out[kafkaclient.TopicPartition{Topic: topic, Partition: p}] = kafkaclient.CommittedOffset{Offset: -1}
		}
	}
	for topic, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				return nil, fmt.Errorf("kafkago: committed offset of %s/%d: %w", topic, p.Partition, p.Error)
			}
			tp := kafkaclient.TopicPartition{Topic: topic, Partition: p.Partition}
			if _, ok := out[tp]; ok && p.CommittedOffset >= 0 {
				out[tp] = kafkaclient.CommittedOffset{Offset: p.CommittedOffset, Metadata: p.Metadata}
			}
		}
	}
	return out, nil
}
