package consumer

import "github.com/kafkaonce/kafkaonce/kafkaoncetype"

// Headers of a message published to Config.DeadLetterTopic, besides the
// original message's own headers (and DefaultMessageIDHeader with the
// message id, when the original lacks it); see package kafkaoncetype.
const (
	HeaderConsumer        = kafkaoncetype.HeaderConsumer
	HeaderSourceTopic     = kafkaoncetype.HeaderSourceTopic
	HeaderSourcePartition = kafkaoncetype.HeaderSourcePartition
	HeaderSourceOffset    = kafkaoncetype.HeaderSourceOffset
	HeaderErrorClass      = kafkaoncetype.HeaderErrorClass
	HeaderError           = kafkaoncetype.HeaderError
	HeaderDeadLetterID    = kafkaoncetype.HeaderDeadLetterID

	// A letter larger than the dead-letter topic takes is published cut to
	// fit (see docs/failures.md), marked by these three.
	HeaderTruncated       = kafkaoncetype.HeaderTruncated
	HeaderOriginalSize    = kafkaoncetype.HeaderOriginalSize
	HeaderTruncatedReason = kafkaoncetype.HeaderTruncatedReason
)
