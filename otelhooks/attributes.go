package otelhooks

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// Attributes: the semantic conventions' where they have one (messaging.*,
// db.*, error.type), kafkaonce.* for what is this library's own.
var (
	attrConsumer    = attribute.Key("kafkaonce.consumer")
	attrSkipReason  = attribute.Key("kafkaonce.skip_reason")
	attrClass       = attribute.Key("kafkaonce.dead_letter.class")
	attrPermanent   = attribute.Key("kafkaonce.permanent")
	attrAttempt     = attribute.Key("kafkaonce.attempt")
	attrOutcome     = attribute.Key("kafkaonce.outcome")
	attrFirstOffset = attribute.Key("kafkaonce.first_offset")
	attrLastOffset  = attribute.Key("kafkaonce.last_offset")
	attrApplied     = attribute.Key("kafkaonce.applied")
	attrSkipped     = attribute.Key("kafkaonce.skipped")
	attrBatchLimit  = attribute.Key("kafkaonce.batch_limit")
	attrSerialized  = attribute.Key("kafkaonce.serialized")
	attrError       = attribute.Key("kafkaonce.error")
	attrRelay       = attribute.Key("kafkaonce.relay")
	attrDestination = attribute.Key("kafkaonce.outbox.destination")
	attrParked      = attribute.Key("kafkaonce.outbox.parked")
	attrShareEvent  = attribute.Key("kafkaonce.share.event")

	kafka      = semconv.MessagingSystemKafka
	postgres   = semconv.DBSystemNamePostgreSQL
	processing = semconv.MessagingOperationTypeProcess
	settling   = semconv.MessagingOperationTypeSettle
	topicKey   = semconv.MessagingDestinationNameKey
	partKey    = semconv.MessagingDestinationPartitionIDKey
	offsetKey  = semconv.MessagingKafkaOffsetKey
	idKey      = semconv.MessagingMessageIDKey
	opNameKey  = semconv.MessagingOperationNameKey
	countKey   = semconv.MessagingBatchMessageCountKey
	errTypeKey = semconv.ErrorTypeKey
)
