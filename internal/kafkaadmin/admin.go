// Package kafkaadmin asks Kafka what the operator tools need to know:
// partitions, log bounds, a group's committed offsets and members, and
// offsets by time; and resets a group's offsets. It speaks through
// franz-go, as the consumer does by default.
package kafkaadmin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
)

// Admin talks to one cluster.
type Admin struct {
	client *franz.Client
	adm    *kadm.Client
	close  sync.Once
}

// New returns an Admin for cfg's brokers, TLS and SASL.
func New(cfg kafkaclient.Config) (*Admin, error) {
	c, err := franz.New(cfg)
	if err != nil {
		return nil, err
	}
	return &Admin{client: c, adm: kadm.NewClient(c.Kgo())}, nil
}

// Client is the Kafka client the Admin speaks through, for fetching.
func (a *Admin) Client() *franz.Client { return a.client }

// Close releases the connections. Calling it again does nothing.
func (a *Admin) Close() { a.close.Do(a.client.Close) }

// Partitions returns the partition numbers of topic, in order.
func (a *Admin) Partitions(ctx context.Context, topic string) ([]int, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	tds, err := a.adm.ListTopics(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: metadata of %s: %w", topic, err)
	}
	td, ok := tds[topic]
	if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
		return nil, &NoTopicError{Topic: topic}
	}
	if td.Err != nil {
		return nil, fmt.Errorf("kafka: topic %s: %w", topic, td.Err)
	}
	ps := make([]int, 0, len(td.Partitions))
	for p := range td.Partitions {
		ps = append(ps, int(p))
	}
	slices.Sort(ps)
	return ps, nil
}

// NoTopicError is Partitions' answer for a topic the cluster does not
// have: Kafka answered, so other requests to it may succeed.
type NoTopicError struct{ Topic string }

func (e *NoTopicError) Error() string { return fmt.Sprintf("kafka: topic %s does not exist", e.Topic) }

// Bounds are a partition's first offset still in the log, its end (the
// offset the next message will get), its last stable offset (the end,
// unless a transaction is open: then its first record) and its topic's id.
type Bounds = kafkaclient.Bounds

// LogBounds returns the bounds of the given partitions of topic.
func (a *Admin) LogBounds(ctx context.Context, topic string, partitions []int) (map[int]Bounds, error) {
	out := map[int]Bounds{}
	if len(partitions) == 0 {
		return out, nil
	}
	all, err := a.client.TopicBounds(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: list offsets of %s: %w", topic, err)
	}
	for _, p := range partitions {
		if p < 0 || p >= len(all) {
			return nil, fmt.Errorf("kafka: list offsets of %s/%d: the topic has no such partition", topic, p)
		}
		out[p] = all[p]
	}
	return out, nil
}

// OffsetsAt returns, for each partition, the first offset whose message time
// is at or after t (the log end when there is none).
func (a *Admin) OffsetsAt(ctx context.Context, topic string, partitions []int, t time.Time) (map[int]int64, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	listed, err := a.adm.ListOffsetsAfterMilli(ctx, t.UnixMilli(), topic)
	if err != nil {
		return nil, fmt.Errorf("kafka: offsets of %s at %v: %w", topic, t, err)
	}
	out := map[int]int64{}
	for _, p := range partitions {
		o, ok := listed.Lookup(topic, int32(p))
		if !ok {
			return nil, fmt.Errorf("kafka: offsets of %s/%d at %v: no answer", topic, p, t)
		}
		if o.Err != nil {
			return nil, fmt.Errorf("kafka: offsets of %s/%d at %v: %w", topic, p, t, o.Err)
		}
		out[p] = o.Offset
	}
	return out, nil
}

// Committed returns a group's committed offset per partition of topic (-1
// where nothing is committed).
func (a *Admin) Committed(ctx context.Context, group, topic string, partitions []int) (map[int]int64, error) {
	commits, err := a.Commits(ctx, group, topic, partitions)
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	for p, c := range commits {
		out[p] = c.Offset
	}
	return out, nil
}

// Commit is a group's committed offset of a partition, with the metadata
// it was committed with (a kafkaonce consumer's is a commitmark.Mark).
type Commit struct {
	// Offset is -1 where nothing is committed.
	Offset   int64
	Metadata string
}

// Commits returns a group's committed offset per partition of topic, with
// its metadata: what tells a group offset the consumer committed against
// this database from one another client (or a reset) committed.
func (a *Admin) Commits(ctx context.Context, group, topic string, partitions []int) (map[int]Commit, error) {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	out := map[int]Commit{}
	for _, p := range partitions {
		out[p] = Commit{Offset: -1}
	}
	resp, err := a.adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("kafka: committed offsets of group %s: %w", group, err)
	}
	for _, p := range partitions {
		if o, ok := resp.Lookup(topic, int32(p)); ok && o.Err == nil && o.At >= 0 {
			out[p] = Commit{Offset: o.At, Metadata: o.Metadata}
		}
	}
	return out, nil
}

// CommitOffsets sets a group's offsets from outside the group, as a reset
// does. Kafka accepts it only while the group has no members. Kafka answers
// each partition on its own: when it refused some, the error is a
// *CommitError that says which were committed all the same. Any other
// error is the request's: Kafka may or may not have committed any.
func (a *Admin) CommitOffsets(ctx context.Context, group, topic string, offsets map[int]int64) error {
	ctx, cancel := kafkaclient.Bounded(ctx)
	defer cancel()
	os := kadm.Offsets{}
	for p, off := range offsets {
		os.Add(kadm.Offset{Topic: topic, Partition: int32(p), At: off, LeaderEpoch: -1})
	}
	resp, err := a.adm.CommitOffsets(ctx, group, os)
	if err != nil {
		return fmt.Errorf("kafka: commit offsets of group %s: %w", group, err)
	}
	ce := &CommitError{Group: group, Topic: topic, Committed: map[int]int64{}, Refused: map[int]error{}}
	for p, off := range offsets {
		r, ok := resp.Lookup(topic, int32(p))
		switch {
		case !ok:
			ce.Refused[p] = errors.New("no answer")
		case r.Err != nil:
			ce.Refused[p] = r.Err
		default:
			ce.Committed[p] = off
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
