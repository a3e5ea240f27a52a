package consumer

// Headers of a message published to Config.DeadLetterTopic, besides the
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
)
