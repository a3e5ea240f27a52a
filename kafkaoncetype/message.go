package kafkaoncetype

import (
	"strconv"
	"time"
)

// Message is one Kafka message as a handler sees it.
//
// A Message and the slices it holds are valid only until the handler
// returns: kafkaonce may reuse their memory for the next batch. Copy what
// you need to keep.
type Message struct {
	// ID is the message id the consumer derived with its MessageID rule:
	// the key under which the message is claimed in processed_messages.
	ID string

	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	// Time is the timestamp Kafka stored with the message.
	Time time.Time
}

// MaxMessageIDLen is the longest accepted message id, in bytes. It leaves
// room for a log position (a topic name of up to 249 bytes plus partition
// and offset) while keeping index entries small.
const MaxMessageIDLen = 512

// Header returns the value of the last header named key. Kafka allows a key
// to repeat; the last one wins, as it does for most clients that flatten
// headers into a map.
func (m *Message) Header(key string) (value []byte, ok bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == key {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}

// Position returns "topic/partition/offset", the message's place in the log.
func (m *Message) Position() string { return Position(m.Topic, m.Partition, m.Offset) }

// Position returns "topic/partition/offset", the form every kafkaonce
// message, log line and tool names a place in a log with.
func Position(topic string, partition int, offset int64) string {
	b := make([]byte, 0, len(topic)+24)
	b = append(b, topic...)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(partition), 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, offset, 10)
	return string(b)
}
