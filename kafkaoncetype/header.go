package kafkaoncetype

// Header is a Kafka record header. Kafka allows a key to repeat, and keeps
// headers in the order the producer wrote them.
type Header struct {
	Key   string
	Value []byte
}

// DefaultMessageIDHeader is the header a message's id is read from unless
// the consumer is told otherwise, and the header a dead letter carries its
// id in.
const DefaultMessageIDHeader = "message-id"

// Headers of a message published to a dead-letter topic, besides the
// original message's own headers (and DefaultMessageIDHeader with the
// message id, when the original lacks it).
const (
	HeaderConsumer        = "kafkaonce-consumer"
	HeaderSourceTopic     = "kafkaonce-source-topic"
	HeaderSourcePartition = "kafkaonce-source-partition"
	HeaderSourceOffset    = "kafkaonce-source-offset"
	HeaderErrorClass      = "kafkaonce-error-class"
	HeaderError           = "kafkaonce-error"
	HeaderDeadLetterID    = "kafkaonce-dead-letter-id"

	// A letter larger than the dead-letter topic takes is published cut to
	// fit (see docs/failures.md) with these three: what was cut ("value",
	// "headers", "key", "error", comma-separated), the letter's size in
	// bytes before, and why. The whole letter stays in dead_letters.
	HeaderTruncated       = "kafkaonce-truncated"
	HeaderOriginalSize    = "kafkaonce-original-size"
	HeaderTruncatedReason = "kafkaonce-truncated-reason"
)
