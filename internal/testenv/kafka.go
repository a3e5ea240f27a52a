package testenv

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
)

var kafkaShared struct {
	sync.Once
	k   *devenv.Kafka
	err error
}

// Kafka is the test binary's broker.
type Kafka struct {
	*devenv.Kafka
	// consumerSessionMs is the session timeout ConsumerProtocolGroup gives
	// a group (see ConsumerProtocolKafkaSession).
	consumerSessionMs string
}

// NewKafka returns the test binary's broker, starting it on first use.
func NewKafka(tb testing.TB) *Kafka {
	tb.Helper()
	requireMain(tb)
	kafkaShared.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		kafkaShared.k, kafkaShared.err = devenv.StartKafka(ctx, nil)
		if kafkaShared.err == nil {
			atExit(func() { _ = kafkaShared.k.Close() })
		}
	})
	if kafkaShared.err != nil {
		tb.Fatalf("testenv: %v", kafkaShared.err)
	}
	return &Kafka{Kafka: kafkaShared.k}
}

// Topic creates a topic with the given number of partitions, unique to the
// test, and waits until every partition has a leader.
func (k *Kafka) Topic(tb testing.TB, partitions int) string {
	tb.Helper()
	topic := Name(tb, "topic")
	if err := devenv.CreateTopic(context.Background(), k.Brokers, topic, partitions); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	return topic
}

// Group returns a consumer group id unique to the test.
func (k *Kafka) Group(tb testing.TB) string { return Name(tb, "group") }

// Produce writes messages to topic, each to the partition its Partition
// field names, and fails the test if the broker does not acknowledge all.
func (k *Kafka) Produce(tb testing.TB, topic string, msgs ...kafka.Message) {
	tb.Helper()
	w := k.Writer(topic)
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		tb.Fatalf("testenv: produce to %s: %v", topic, err)
	}
}

// Writer returns a kafka-go writer that honours each message's Partition.
// It has a transport of its own: kafka-go's shared default transport caches
// cluster metadata and would not know a topic created a moment ago. Close
// the writer to release the transport's connections.
func (k *Kafka) Writer(topic string) *Writer {
	tr := &kafka.Transport{MetadataTTL: time.Second}
	return &Writer{Writer: &kafka.Writer{
		Addr:         kafka.TCP(k.Brokers...),
		Topic:        topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		BatchTimeout: time.Millisecond,
		BatchSize:    1000,
		RequiredAcks: kafka.RequireAll,
		Transport:    tr,
	}, transport: tr}
}

// Writer is a kafka-go writer with its own transport.
type Writer struct {
	*kafka.Writer
	transport *kafka.Transport
}

// Close flushes the writer and closes its connections.
func (w *Writer) Close() error {
	err := w.Writer.Close()
	w.transport.CloseIdleConnections()
	return err
}

// CommittedOffsets returns the group's committed offset for each partition
// of topic (-1 where none is committed).
func (k *Kafka) CommittedOffsets(tb testing.TB, group, topic string, partitions int) map[int]int64 {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[int]int64{}
	for p := range partitions {
		out[p] = -1
	}
	resp, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	switch {
	case errors.Is(err, kerr.GroupIDNotFound):
		return out // no member has joined yet: nothing committed
	case errors.Is(err, kerr.NotCoordinator), errors.Is(err, kerr.CoordinatorNotAvailable), errors.Is(err, kerr.CoordinatorLoadInProgress):
		return out // a fresh cluster is still creating __consumer_offsets; callers poll
	case err != nil:
		tb.Fatalf("testenv: fetch committed offsets: %v", err)
	}
	for p := range partitions {
		if o, ok := resp.Lookup(topic, int32(p)); ok && o.Err == nil && o.At >= 0 {
			out[p] = o.At
		}
	}
	return out
}

// CommittedMetadata returns the metadata committed with the group's offset
// of topic/partition ("" when none is committed).
func (k *Kafka) CommittedMetadata(tb testing.TB, group, topic string, partition int) string {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).FetchOffsets(ctx, group)
	if err != nil {
		tb.Fatalf("testenv: fetch committed offsets: %v", err)
	}
	o, _ := resp.Lookup(topic, int32(partition))
	return o.Metadata
}

// GroupState returns the group's state as the coordinator reports it
// ("Stable", "PreparingRebalance", "CompletingRebalance", "Empty", "Dead"),
// or the error that kept it from answering.
func (k *Kafka) GroupState(group string) (string, error) {
	g, err := k.describeGroup(group)
	return g.State, err
}

// GroupAssignment returns the group's state, its members, and how many
// partitions of topic they hold, as the coordinator reports them. A
// cooperative handover takes two rebalances, and between them the group
// is Stable with the moving partitions held by no member; and a member
// that is starting is not in the group yet: only all three together say
// that the group has settled.
func (k *Kafka) GroupAssignment(group, topic string) (state string, members, assigned int, err error) {
	g, err := k.describeGroup(group)
	members = len(g.Members)
	for _, m := range g.Members {
		if c, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range c.Topics {
				if t.Topic == topic {
					assigned += len(t.Partitions)
				}
			}
		}
	}
	return g.State, members, assigned, err
}

func (k *Kafka) describeGroup(group string) (kadm.DescribedGroup, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		return kadm.DescribedGroup{}, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err != nil {
		return kadm.DescribedGroup{}, err
	}
	g, ok := resp[group]
	if !ok {
		return kadm.DescribedGroup{}, fmt.Errorf("testenv: describe group %s: no answer for the group", group)
	}
	return g, g.Err
}

// CommitGroupOffsets sets a group's committed offsets the way an operator's
// "reset offsets" does: outside any generation, so only while the group has
// no active members.
func (k *Kafka) CommitGroupOffsets(tb testing.TB, group, topic string, offsets map[int]int64) {
	tb.Helper()
	k.CommitGroupOffsetsWithMetadata(tb, group, topic, offsets, "")
}

// CommitGroupOffsetsWithMetadata is CommitGroupOffsets with metadata on
// every offset, as a client that writes some (kafkaonce's mark, say) does.
func (k *Kafka) CommitGroupOffsetsWithMetadata(tb testing.TB, group, topic string, offsets map[int]int64, metadata string) {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	defer cl.Close()
	os := kadm.Offsets{}
	for p, off := range offsets {
		os.Add(kadm.Offset{Topic: topic, Partition: int32(p), At: off, LeaderEpoch: -1, Metadata: metadata})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := kadm.NewClient(cl).CommitOffsets(context.Background(), group, os)
		if err == nil {
			err = resp.Error()
		}
		if err == nil {
			return
		}
		// A group whose last member just left may still be rebalancing.
		if time.Now().After(deadline) {
			tb.Fatalf("testenv: commit offsets of group %s: %v", group, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// DeleteRecordsBefore deletes the messages of topic/partition below offset,
// as retention would.
func (k *Kafka) DeleteRecordsBefore(tb testing.TB, topic string, partition int, offset int64) {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	os := kadm.Offsets{}
	os.Add(kadm.Offset{Topic: topic, Partition: int32(partition), At: offset})
	resp, err := adm.DeleteRecords(context.Background(), os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		tb.Fatalf("testenv: delete records of %s/%d below %d: %v", topic, partition, offset, err)
	}
}

// Admin returns an admin client of brokers, closed when the test ends.
func Admin(tb testing.TB, brokers []string) *kafkaadmin.Admin {
	tb.Helper()
	a, err := kafkaadmin.New(kafkaclient.Config{Brokers: brokers})
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(a.Close)
	return a
}

// Client returns a franz-go client of the broker, closed when the test
// ends.
func (k *Kafka) Client(tb testing.TB) *kgo.Client {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(cl.Close)
	return cl
}
