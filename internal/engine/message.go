package engine

import (
	"strconv"
	"time"

	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Message is one message as the engine tracks it. It mirrors
// consumer.Message field for field, so a *Message converts to a
// *consumer.Message at no cost.
type Message struct {
	// ID is the message id the consumer derived with Config.MessageID: the
	// key under which the message is claimed in processed_messages.
	ID string

	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []kafkaoncetype.Header
	// Time is the timestamp Kafka stored with the message.
	Time time.Time
}

// Position returns "topic/partition/offset", the message's place in the log.
func (m *Message) Position() string {
	return positionString(m.Topic, m.Partition, m.Offset)
}

func positionString(topic string, partition int, offset int64) string {
	b := make([]byte, 0, len(topic)+24)
	b = append(b, topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, offset, 10)
	return string(b)
}
