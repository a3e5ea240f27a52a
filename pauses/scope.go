package pauses

import (
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/kafkaonce/kafkaonce/internal/pgtext"
)

// Scope is what a pause covers: a whole consumer (All), one of its topics
// (Topic) or one partition (Partition). The zero Scope is All.
type Scope struct {
	topic     string
	partition int
	// one is set for a single partition.
	one bool
}

// All is every topic and partition of the consumer.
func All() Scope { return Scope{} }

// Topic is every partition of topic.
func Topic(topic string) Scope { return Scope{topic: topic} }

// Partition is one partition of topic.
func Partition(topic string, partition int) Scope {
	return Scope{topic: topic, partition: partition, one: true}
}

// Topic is the topic the scope covers, "" for every topic.
func (s Scope) Topic() string { return s.topic }

// Partition is the partition the scope covers; ok is false when it covers
// every partition of its topic (or of the consumer).
func (s Scope) Partition() (partition int, ok bool) { return s.partition, s.one }

// Covers reports whether the scope covers the partition.
func (s Scope) Covers(topic string, partition int) bool {
	switch {
	case s.topic == "":
		return true
	case s.topic != topic:
		return false
	default:
		return !s.one || s.partition == partition
	}
}

// String is "every topic", "topic payments" or "payments/3".
func (s Scope) String() string {
	switch {
	case s.topic == "":
		return "every topic"
	case !s.one:
		return "topic " + s.topic
	default:
		return s.topic + "/" + strconv.Itoa(s.partition)
	}
}

// Validate names what is wrong with the scope, and how to fix it; Pause
// and Resume call it.
func (s Scope) Validate() error {
	switch {
	case s.one && s.topic == "":
		return errors.New("pauses: a partition needs its topic: use pauses.Partition(topic, partition), or pauses.All() for the whole consumer")
	case s.one && s.partition < 0:
		return fmt.Errorf("pauses: partition %d is negative: partitions are numbered from 0; use pauses.Topic(%q) for every partition", s.partition, s.topic)
	case s.one && s.partition > math.MaxInt32:
		return fmt.Errorf("pauses: partition %d is past the largest partition number Kafka has (%d)", s.partition, math.MaxInt32)
	case !pgtext.Storable(s.topic):
		return fmt.Errorf("pauses: topic %q is not valid UTF-8 or holds a NUL byte: no Kafka topic is named so", s.topic)
	}
	return nil
}

// row is the scope as the table stores it: topic ” for every topic,
// partition -1 for every partition.
func (s Scope) row() (topic string, partition int) {
	if !s.one {
		return s.topic, -1
	}
	return s.topic, s.partition
}

func scopeOfRow(topic string, partition int) Scope {
	if partition < 0 {
		return Topic(topic)
	}
	return Partition(topic, partition)
}
