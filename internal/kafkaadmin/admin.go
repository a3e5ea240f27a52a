// Package kafkaadmin asks Kafka what the operator tools need to know:
// partitions, log bounds, a group's committed offsets and members, and
// offsets by time; and resets a group's offsets.
package kafkaadmin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// Admin talks to one cluster.
type Admin struct {
	client *kafka.Client
	tr     *kafka.Transport
}

// New returns an Admin for brokers, with the TLS and SASL settings of
// dialer (nil: plaintext).
func New(brokers []string, dialer *kafka.Dialer) *Admin {
	tr := &kafka.Transport{MetadataTTL: time.Second}
	if dialer != nil {
		tr.TLS, tr.SASL, tr.ClientID = dialer.TLS, dialer.SASLMechanism, dialer.ClientID
	}
	return &Admin{client: &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 15 * time.Second, Transport: tr}, tr: tr}
}

// Close releases the connections.
func (a *Admin) Close() { a.tr.CloseIdleConnections() }

// Partitions returns the partition numbers of topic, in order.
func (a *Admin) Partitions(ctx context.Context, topic string) ([]int, error) {
	resp, err := a.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("kafka: metadata of %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.Name != topic {
			continue
		}
		if t.Error != nil {
			return nil, fmt.Errorf("kafka: topic %s: %w", topic, t.Error)
		}
		ps := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ps = append(ps, p.ID)
		}
		sort.Ints(ps)
		return ps, nil
	}
	return nil, fmt.Errorf("kafka: topic %s does not exist", topic)
}

// Bounds are a partition's first offset still in the log and its end (the
// offset the next message will get).
type Bounds struct{ Start, End int64 }

// LogBounds returns the bounds of the given partitions of topic.
func (a *Admin) LogBounds(ctx context.Context, topic string, partitions []int) (map[int]Bounds, error) {
	var reqs []kafka.OffsetRequest
	for _, p := range partitions {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	resp, err := a.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets of %s: %w", topic, err)
	}
	out := map[int]Bounds{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafka: list offsets of %s/%d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = Bounds{Start: p.FirstOffset, End: p.LastOffset}
	}
	return out, nil
}

// OffsetsAt returns, for each partition, the first offset whose message time
// is at or after t (the log end when there is none).
func (a *Admin) OffsetsAt(ctx context.Context, topic string, partitions []int, t time.Time) (map[int]int64, error) {
	var reqs []kafka.OffsetRequest
	for _, p := range partitions {
		reqs = append(reqs, kafka.TimeOffsetOf(p, t))
	}
	resp, err := a.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("kafka: offsets of %s at %v: %w", topic, t, err)
	}
	bounds, err := a.LogBounds(ctx, topic, partitions)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("kafka: offsets of %s/%d at %v: %w", topic, p.Partition, t, p.Error)
		}
		out[p.Partition] = bounds[p.Partition].End
		for off := range p.Offsets {
			if off >= 0 {
				out[p.Partition] = off
			}
		}
	}
	return out, nil
}

// Committed returns a group's committed offset per partition of topic (-1
// where nothing is committed).
func (a *Admin) Committed(ctx context.Context, group, topic string, partitions []int) (map[int]int64, error) {
	out := map[int]int64{}
	for _, p := range partitions {
		out[p] = -1
	}
	resp, err := a.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: partitions}})
	if err != nil {
		return nil, fmt.Errorf("kafka: committed offsets of group %s: %w", group, err)
	}
	if errors.Is(resp.Error, kafka.GroupIdNotFound) {
		return out, nil
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("kafka: committed offsets of group %s: %w", group, resp.Error)
	}
	for _, p := range resp.Topics[topic] {
		if p.Error == nil {
			out[p.Partition] = p.CommittedOffset
		}
	}
	return out, nil
}

// Group is a consumer group's state.
type Group struct {
	State   string
	Members []string // member ids
}

// DescribeGroup returns a group's state and members.
func (a *Admin) DescribeGroup(ctx context.Context, group string) (Group, error) {
	resp, err := a.client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil {
		return Group{}, fmt.Errorf("kafka: describe group %s: %w", group, err)
	}
	for _, g := range resp.Groups {
		if g.GroupID != group {
			continue
		}
		if g.Error != nil && !errors.Is(g.Error, kafka.GroupIdNotFound) {
			return Group{}, fmt.Errorf("kafka: describe group %s: %w", group, g.Error)
		}
		out := Group{State: g.GroupState}
		for _, m := range g.Members {
			out.Members = append(out.Members, m.MemberID)
		}
		return out, nil
	}
	return Group{State: "Dead"}, nil
}

// CommitOffsets sets a group's offsets from outside the group, as a reset
// does. Kafka accepts it only while the group has no members. Kafka answers
// each partition on its own: when it refused some, the error is a
// *CommitError that says which were committed all the same. Any other
// error is the request's: Kafka may or may not have committed any.
func (a *Admin) CommitOffsets(ctx context.Context, group, topic string, offsets map[int]int64) error {
	var commits []kafka.OffsetCommit
	for p, off := range offsets {
		commits = append(commits, kafka.OffsetCommit{Partition: p, Offset: off})
	}
	resp, err := a.client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{topic: commits}})
	if err != nil {
		return fmt.Errorf("kafka: commit offsets of group %s: %w", group, err)
	}
	ce := &CommitError{Group: group, Topic: topic, Committed: map[int]int64{}, Refused: map[int]error{}}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			ce.Refused[p.Partition] = p.Error
		} else if off, ok := offsets[p.Partition]; ok {
			ce.Committed[p.Partition] = off
		}
	}
	if len(ce.Refused) > 0 {
		return ce
	}
	return nil
}

// CommitError is an offset commit Kafka refused for some partitions, and
// accepted for the others.
type CommitError struct {
	Group, Topic string
	// Committed are the partitions whose offsets Kafka committed, with the
	// offsets; Refused those it refused, with why.
	Committed map[int]int64
	Refused   map[int]error
}

func (e *CommitError) Error() string {
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(e.Refused)) {
		parts = append(parts, fmt.Sprintf("%s/%d: %v", e.Topic, p, e.Refused[p]))
	}
	return fmt.Sprintf("kafka: commit offsets of group %s refused on %s", e.Group, strings.Join(parts, ", "))
}
