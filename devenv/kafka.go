package devenv

import (
	"context"
	"fmt"
	"time"

	"github.com/kafkaonce/kafkaonce/internal/devenv"
	"github.com/kafkaonce/kafkaonce/internal/kafkaadmin"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient"
	"github.com/kafkaonce/kafkaonce/internal/kafkaclient/franz"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// MessageIDHeader is the header Produce sets to a Message's ID: the one
// kafkaonce's consumers read ids from by default
// (consumer.DefaultMessageIDHeader).
const MessageIDHeader = "message-id"

// Message is a message to produce.
type Message struct {
	// ID, when set, is sent in the MessageIDHeader header, as a producer
	// that follows kafkaonce's default convention does.
	ID string
	// Key chooses the partition (by hash, as Java's default partitioner
	// does); messages without a key are spread over the partitions.
	Key, Value []byte
	Headers    []kafkaoncetype.Header
}

// CreateTopic creates topic with the given number of partitions and waits
// until each has a leader. A topic that exists already is not an error.
func (e *Env) CreateTopic(ctx context.Context, topic string, partitions int) error {
	return devenv.CreateTopic(ctx, e.Brokers, topic, partitions)
}

// Produce writes msgs to topic, in order per key, and returns once the
// broker has acknowledged all of them (acks=all).
func (e *Env) Produce(ctx context.Context, topic string, msgs ...Message) error {
	client, err := franz.New(kafkaclient.Config{Brokers: e.Brokers})
	if err != nil {
		return fmt.Errorf("devenv: produce to %s: %w", topic, err)
	}
	defer client.Close()
	recs := make([]kafkaclient.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = kafkaclient.Record{Key: m.Key, Value: m.Value, Headers: append([]kafkaoncetype.Header(nil), m.Headers...)}
		if m.ID != "" {
			recs[i].Headers = append(recs[i].Headers, kafkaoncetype.Header{Key: MessageIDHeader, Value: []byte(m.ID)})
		}
	}
	if err := client.Publish(ctx, topic, recs); err != nil {
		return fmt.Errorf("devenv: produce %d messages to %s: %w", len(msgs), topic, err)
	}
	return nil
}

// Rewind sets the committed offset of consumer group to the start of every
// partition of topic (its log start offset, which retention moves), as
// `kafka-consumer-groups --reset-offsets --to-earliest` does, so the group's next member reads the topic again.
// The group must have no members: Rewind retries for up to 30 seconds
// while the last one leaves. (kafkaonce's stored positions still skip
// what was processed; `kafkaonce replay` moves both.)
func (e *Env) Rewind(ctx context.Context, group, topic string) error {
	admin, err := kafkaadmin.New(kafkaclient.Config{Brokers: e.Brokers})
	if err != nil {
		return fmt.Errorf("devenv: rewind %s: %w", topic, err)
	}
	defer admin.Close()
	parts, err := admin.Partitions(ctx, topic)
	if err != nil {
		return fmt.Errorf("devenv: rewind %s: %w", topic, err)
	}
	// The log start, not 0: once retention has deleted the head of a
	// partition, offset 0 is gone, and a consumer starting there would
	// stop the partition for the missing messages (ErrMessagesDeleted).
	bounds, err := admin.LogBounds(ctx, topic, parts)
	if err != nil {
		return fmt.Errorf("devenv: rewind %s: %w", topic, err)
	}
	start := make(map[int]int64, len(parts))
	for _, p := range parts {
		start[p] = bounds[p].Start
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := admin.CommitOffsets(ctx, group, topic, start)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("devenv: rewind group %s on %s (is a member still running?): %w", group, topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// SetShareStart sets where share group starts reading a partition it has
// no state for yet (its share.auto.offset.reset config): "earliest" or
// "latest" (Kafka's default). Set it before the group's first member
// fetches, as `kafka-configs.sh --alter --entity-type groups
// --add-config share.auto.offset.reset=earliest` does: a share group
// (consumer.ShareGroup) takes no StartOffset of its own.
func (e *Env) SetShareStart(ctx context.Context, group, start string) error {
	admin, err := kafkaadmin.New(kafkaclient.Config{Brokers: e.Brokers})
	if err != nil {
		return fmt.Errorf("devenv: share start of %s: %w", group, err)
	}
	defer admin.Close()
	if err := admin.SetShareStart(ctx, group, start); err != nil {
		return fmt.Errorf("devenv: share start of %s: %w", group, err)
	}
	return nil
}
