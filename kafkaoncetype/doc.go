// Package kafkaoncetype declares the types that kafkaonce's packages share,
// once: the message a handler gets, the payloads of the consumer's hooks,
// the consumer's settings that are enumerations, the errors it reports and
// the records of the claims and dead letters behind them. The public
// packages, the engine and the Kafka clients all use these, so nothing
// converts between copies.
//
// It imports nothing of kafkaonce's. Users rarely name it: package consumer
// re-exports each of these types under the same name (consumer.Message is
// a kafkaoncetype.Message), and dedupe and deadletter re-export the
// records they store.
package kafkaoncetype
