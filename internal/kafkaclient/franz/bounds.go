package franz

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

// Bounds implements kafkaclient.Client.
func (c *Client) Bounds(ctx context.Context, topic string, partition int) (kafkaclient.Bounds, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	id, _, err := c.topicMetadata(ctx, topic)
	if err != nil {
		return kafkaclient.Bounds{}, err
	}
	bs, err := c.bounds(ctx, topic, id, []int32{int32(partition)})
	if err != nil {
		return kafkaclient.Bounds{}, err
	}
	return bs[0], nil
}

// TopicBounds implements kafkaclient.Client.
func (c *Client) TopicBounds(ctx context.Context, topic string) ([]kafkaclient.Bounds, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	id, n, err := c.topicMetadata(ctx, topic)
	if err != nil {
		return nil, err
	}
	parts := make([]int32, n)
	for i := range parts {
		parts[i] = int32(i)
	}
	return c.bounds(ctx, topic, id, parts)
}

// topicMetadata reads a topic's id and how many partitions it has.
func (c *Client) topicMetadata(ctx context.Context, topic string) (kafkaclient.TopicID, int, error) {
	return TopicMetadata(ctx, c.admin, topic)
}

// TopicMetadata reads a topic's id (zero from a broker that gives none)
// and how many partitions it has, with cl: one Metadata request, at the
// highest version both sides speak (ids came with version 10).
func TopicMetadata(ctx context.Context, cl *kgo.Client, topic string) (kafkaclient.TopicID, int, error) {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return kafkaclient.TopicID{}, 0, fmt.Errorf("franz: metadata of %s: %w", topic, err)
	}
	if len(resp.Topics) != 1 {
		return kafkaclient.TopicID{}, 0, fmt.Errorf("franz: metadata of %s: no answer for the topic", topic)
	}
	rt := resp.Topics[0]
	if err := kerr.ErrorForCode(rt.ErrorCode); err != nil {
		return kafkaclient.TopicID{}, 0, fmt.Errorf("franz: metadata of %s: %w", topic, err)
	}
	return kafkaclient.TopicID(rt.TopicID), len(rt.Partitions), nil
}

// bounds reads the log start, the high watermark and the last stable
// offset of partitions of the topic of id, read just before: three
// ListOffsets requests, which kgo sends to each partition's leader. The
// id comes first: offsets read after it are of that topic or of one
// created since, which the next read of the id tells.
func (c *Client) bounds(ctx context.Context, topic string, id kafkaclient.TopicID, parts []int32) ([]kafkaclient.Bounds, error) {
	start, err := c.listOffsets(ctx, topic, parts, -2, 0)
	if err != nil {
		return nil, fmt.Errorf("franz: log start of %s: %w", topic, err)
	}
	end, err := c.listOffsets(ctx, topic, parts, -1, 0)
	if err != nil {
		return nil, fmt.Errorf("franz: log end of %s: %w", topic, err)
	}
	stable, err := c.listOffsets(ctx, topic, parts, -1, 1)
	if err != nil {
		return nil, fmt.Errorf("franz: last stable offset of %s: %w", topic, err)
	}
	out := make([]kafkaclient.Bounds, len(parts))
	for i, p := range parts {
		out[i] = kafkaclient.Bounds{Start: start[p], End: end[p], Stable: min(stable[p], end[p]), TopicID: id}
	}
	return out, nil
}

// listOffsets asks for the offset at timestamp (-2: the log start, -1: its
// end) of each partition, at an isolation level (1: read committed, whose
// end is the last stable offset).
func (c *Client) listOffsets(ctx context.Context, topic string, parts []int32, timestamp int64, isolation int8) (map[int32]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	req.ReplicaID = -1
	req.IsolationLevel = isolation
	t := kmsg.NewListOffsetsRequestTopic()
	t.Topic = topic
	for _, p := range parts {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = p
		rp.Timestamp = timestamp
		rp.CurrentLeaderEpoch = -1
		t.Partitions = append(t.Partitions, rp)
	}
	req.Topics = append(req.Topics, t)
	resp, err := req.RequestWith(ctx, c.admin)
	if err != nil {
		return nil, err
	}
	out := make(map[int32]int64, len(parts))
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				return nil, fmt.Errorf("%s/%d: %w", topic, rp.Partition, err)
			}
			out[rp.Partition] = rp.Offset
		}
	}
	for _, p := range parts {
		if _, ok := out[p]; !ok {
			return nil, fmt.Errorf("%s/%d: no answer", topic, p)
		}
	}
	return out, nil
}
