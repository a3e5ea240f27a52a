package consumer

import (
	"time"

	"github.com/kafkaonce/kafkaonce/internal/engine"
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Message is one Kafka message as a Handler sees it.
//
// A Message and the slices it holds are valid only until the Handler
// returns: kafkaonce may reuse their memory for the next batch. Copy what
// you need to keep.
type Message struct {
	// ID is the message id the consumer derived with Config.MessageID: the
	// key under which the message is claimed in processed_messages.
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

// Header is a Kafka message header: a key, which may repeat, and a value.
type Header = kafkaoncetype.Header

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
func (m *Message) Position() string { return (*engine.Message)(m).Position() }
