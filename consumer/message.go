package consumer

import (
	"github.com/kafkaonce/kafkaonce/kafkaoncetype"
)

// Message is one Kafka message as a Handler sees it. It and the slices it
// holds are valid only until the Handler returns: copy what you keep.
type Message = kafkaoncetype.Message

// Header is a Kafka message header: a key, which may repeat, and a value.
type Header = kafkaoncetype.Header
